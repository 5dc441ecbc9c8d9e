"""Seeded inputs and the list of cases shared by ``record_verl.py`` and the parity test.

Pure torch/numpy, so it imports the same way under verl 0.9.1's side environment (where
``verl`` is the released package) and under this repository's test run. Each case is a plain
dict: ``id`` (unique), ``kind`` (``adv``, ``loss``, ``agg``, ``corr``, ``kl``, ``value``),
``name`` (the registered name) and the settings both sides turn into their own calls.
"""

from __future__ import annotations

import numpy as np
import torch

SEED = 1234
B, R, P = 12, 8, 3  # rows, response length, prompt length

# Rows 0-3 share "a", 4-6 "b", 7-8 "c" (8 is an empty response), 9 is alone ("d"), and
# 10-11 ("e") have identical scores, so their group std is 0.
UIDS = ["a", "a", "a", "a", "b", "b", "b", "c", "c", "d", "e", "e"]
# The same rows with no single-sample group (grpo_passk needs at least two per group).
UIDS_PAIRS = ["a", "a", "a", "a", "b", "b", "b", "c", "c", "d", "d", "d"]

# Response masks: full rows, right padding, an empty row, and interior gaps (multi-turn
# observation tokens between two assistant turns).
MASK_ROWS = [
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 0, 0, 0],
    [1, 1, 0, 0, 1, 1, 1, 0],
    [1, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 0, 0, 1, 1, 0],
    [1, 1, 1, 1, 0, 0, 0, 0],
    [1, 1, 1, 1, 1, 1, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 0, 1, 1, 0, 0],
    [1, 1, 1, 1, 1, 1, 1, 0],
    [1, 1, 1, 1, 1, 1, 1, 0],
]
GDPO_KEYS = ["format_reward", "accuracy_reward"]


def make_inputs(seed: int = SEED) -> dict:
    """Every input tensor of every case (float32), from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen)

    mask = torch.tensor(MASK_ROWS, dtype=torch.float32)
    rewards = randn(B, R) * 0.5 * mask
    rewards[11] = rewards[10]  # group "e": equal scores
    rewards[2, 3] = 0.7  # a reward inside an interior gap (ignored by return-based estimators)
    old_log_probs = -rand(B, R) * 3.0
    log_prob = (old_log_probs + randn(B, R) * 0.3).clamp(max=-1e-3)
    # extreme ratios with valid probabilities: exp(28) and exp(-27)
    old_log_probs[0, 2], log_prob[0, 2] = -30.0, -2.0
    old_log_probs[4, 1], log_prob[4, 1] = -1.0, -28.0
    rollout_log_probs = (old_log_probs + randn(B, R) * 0.4).clamp(max=-1e-3)
    rollout_log_probs[1, 0] = old_log_probs[1, 0] - 3.0
    advantages = randn(B, R)
    advantages[3] = 0.0
    advantages[5, :3] = 0.0
    probs = old_log_probs.exp()
    sum_pi_squared = probs.square() + (1 - probs).square() * rand(B, R)
    attention_mask = torch.ones(B, P + R, dtype=torch.long)
    attention_mask[:, P:] = _contiguous_response(mask)
    return {
        "response_mask": mask,
        "token_level_rewards": rewards,
        "values": randn(B, R),
        "reward_baselines": randn(B),
        "old_log_probs": old_log_probs,
        "log_prob": log_prob,
        "rollout_log_probs": rollout_log_probs,
        "advantages": advantages,
        "sum_pi_squared": sum_pi_squared,
        "rollout_is_weights": 0.5 + rand(B, R),
        "loss_mat": randn(B, R),
        "ref_log_prob": (old_log_probs + randn(B, R) * 0.5).clamp(max=-1e-3),
        "vpreds": randn(B, R),
        "returns": randn(B, R),
        "prompts": torch.zeros(B, P, dtype=torch.long),
        "attention_mask": attention_mask,
        "format_reward": rand(B),
        "accuracy_reward": (rand(B) > 0.5).float(),
    }


def _contiguous_response(mask: torch.Tensor) -> torch.Tensor:
    """Attention mask of the response: 1 up to the last valid token (gaps are attended)."""
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=1, keepdim=True).values
    return (positions <= last).long()


def index(kind: str = "uids") -> np.ndarray:
    """The uid column as verl's trainer passes it (a numpy object array)."""
    return np.array(UIDS if kind == "uids" else UIDS_PAIRS, dtype=object)


# ----------------------------------------------------------------------------- cases
def _adv(id_: str, name: str, **settings) -> dict:
    return {"id": f"adv/{id_}", "kind": "adv", "name": name, **settings}


ADV_CASES = [
    _adv("gae", "gae", gamma=0.9, lam=0.8),
    _adv("grpo", "grpo", norm_adv_by_std_in_grpo=True),
    _adv("grpo[no_std]", "grpo", norm_adv_by_std_in_grpo=False),
    _adv("grpo_vectorized", "grpo_vectorized", norm_adv_by_std_in_grpo=True),
    _adv("grpo_vectorized[no_std]", "grpo_vectorized", norm_adv_by_std_in_grpo=False),
    _adv("gdpo[fallback]", "gdpo", norm_adv_by_std_in_grpo=True),
    _adv("gdpo[keys]", "gdpo", norm_adv_by_std_in_grpo=True, gdpo_reward_keys=GDPO_KEYS),
    _adv(
        "gdpo[weights]",
        "gdpo",
        norm_adv_by_std_in_grpo=False,
        gdpo_reward_keys=GDPO_KEYS,
        gdpo_reward_weights=[0.25, 2.0],
    ),
    _adv("grpo_passk", "grpo_passk", norm_adv_by_std_in_grpo=True, uids="pairs"),
    _adv("grpo_passk[no_std]", "grpo_passk", norm_adv_by_std_in_grpo=False, uids="pairs"),
    _adv("reinforce_plus_plus_baseline", "reinforce_plus_plus_baseline"),
    _adv("rloo", "rloo"),
    _adv("rloo_vectorized", "rloo_vectorized"),
    _adv("opo", "opo"),
    _adv("reinforce_plus_plus", "reinforce_plus_plus", gamma=0.9),
    _adv("reinforce_plus_plus[gamma1]", "reinforce_plus_plus", gamma=1.0),
    _adv("remax", "remax"),
    _adv("gpg", "gpg"),
    _adv("optimal_token_baseline", "optimal_token_baseline"),
    _adv("optimal_token_baseline[is]", "optimal_token_baseline", with_is_weights=True),
    _adv("optimal_token_baseline[pairs]", "optimal_token_baseline", uids="pairs"),
    _adv("tir_optimal_token_baseline", "tir_optimal_token_baseline"),
    _adv("tir_optimal_token_baseline[is]", "tir_optimal_token_baseline", with_is_weights=True),
    _adv("tir_optimal_token_baseline[pairs]", "tir_optimal_token_baseline", uids="pairs"),
]

AGG_MODES = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
# Global-batch normalisation as verl's actor passes it: this micro-batch is a part of a
# mini-batch of 120 valid tokens and 16 rows, spread over 2 data-parallel ranks.
GLOBAL_INFO = {"dp_size": 2, "batch_num_tokens": 120, "global_batch_size": 16, "loss_scale_factor": None}
GLOBAL_INFO_SCALED = {**GLOBAL_INFO, "loss_scale_factor": 32}

# Actor settings per loss (verl's ActorConfig fields, and policy_loss.* under "policy_loss").
BASE_ACTOR = {
    "clip_ratio": 0.2,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "policy_loss": {
        "clip_cov_ratio": 0.05,
        "clip_cov_lb": 0.05,
        "clip_cov_ub": 5.0,
        "kl_cov_ratio": 0.1,
        "ppo_kl_coef": 0.1,
        "dro_beta": 0.1,
    },
}
ACTOR_BY_LOSS = {
    "gspo": {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
    "dppo_tv": {"clip_ratio_low": 0.15, "clip_ratio_high": 0.2, "clip_ratio_c": 20.0},
    "dppo_kl": {"clip_ratio_low": 0.05, "clip_ratio_high": 0.08, "clip_ratio_c": 20.0},
    "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
    "geo_mean": {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4},
}
BYPASS_SETTINGS = {
    "ppo_clip": {"loss_type": "ppo_clip", "rollout_is": None, "rollout_rs": None},
    "ppo_clip+rs": {
        "loss_type": "ppo_clip",
        "rollout_is": "token",
        "rollout_rs": "token_k1,seq_mean_k3",
        "rollout_rs_threshold": "0.6_1.6,0.05",
    },
    "reinforce+seq_is": {"loss_type": "reinforce", "rollout_is": "sequence", "rollout_is_threshold": 2.0},
    "reinforce+token_is+rs": {
        "loss_type": "reinforce",
        "rollout_is": "token",
        "rollout_is_threshold": 1.5,
        "rollout_rs": "seq_max_k2",
        "rollout_rs_threshold": 0.3,
    },
    "reinforce+icepop": {"loss_type": "reinforce", "rollout_is": "token", "rollout_is_threshold": "0.8_1.25"},
}
LOSS_NAMES = [
    "vanilla",
    "dppo_tv",
    "dppo_kl",
    "gspo",
    "sapo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dro",
    "cispo",
]


def actor_settings(name: str, rollout_correction: dict | None = None) -> dict:
    """The actor config of a loss case as a nested plain dict."""
    settings = {**BASE_ACTOR, **ACTOR_BY_LOSS.get(name, {})}
    settings["policy_loss"] = {**BASE_ACTOR["policy_loss"], "loss_mode": name}
    if rollout_correction is not None:
        settings["policy_loss"]["rollout_correction"] = rollout_correction
    return settings


def _loss_cases() -> list[dict]:
    cases = []
    for name in LOSS_NAMES:
        for mode in AGG_MODES:
            cases.append(_loss(name, mode, actor_settings(name)))
        cases.append(_loss(name, "token-mean", actor_settings(name), suffix="+is", with_is_weights=True))
        cases.append(
            _loss(name, "seq-mean-token-mean", actor_settings(name), suffix="+global", info=GLOBAL_INFO)
        )
    for variant, corr in BYPASS_SETTINGS.items():
        for mode in ("token-mean", "seq-mean-token-sum"):
            cases.append(
                _loss("bypass_mode", mode, actor_settings("bypass_mode", corr), suffix=f"[{variant}]")
            )
    for mode in AGG_MODES:
        cases.append(_loss("vanilla", mode, actor_settings("vanilla"), suffix="+global", info=GLOBAL_INFO))
    cases.append(
        _loss(
            "vanilla",
            "seq-mean-token-sum-norm",
            actor_settings("vanilla"),
            suffix="+scaled",
            info=GLOBAL_INFO_SCALED,
        )
    )
    return cases


def _loss(name: str, mode: str, actor: dict, suffix: str = "", **extra) -> dict:
    return {
        "id": f"loss/{name}{suffix}/{mode}",
        "kind": "loss",
        "name": name,
        "mode": mode,
        "actor": actor,
        **extra,
    }


LOSS_CASES = _loss_cases()

AGG_CASES = [
    *({"id": f"agg/{m}", "kind": "agg", "name": m, "info": {}} for m in AGG_MODES),
    *({"id": f"agg/{m}+global", "kind": "agg", "name": m, "info": GLOBAL_INFO} for m in AGG_MODES),
    {
        "id": "agg/seq-mean-token-sum-norm+scaled",
        "kind": "agg",
        "name": "seq-mean-token-sum-norm",
        "info": GLOBAL_INFO_SCALED,
    },
]

CORR_SETTINGS = {
    "token_tis": {"rollout_is": "token", "rollout_is_threshold": 2.0},
    "sequence_tis": {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
    "token_icepop": {"rollout_is": "token", "rollout_is_threshold": "0.5_1.5"},
    "sequence_icepop": {"rollout_is": "sequence", "rollout_is_threshold": "0.2_3.0"},
    "token_tis_batch_norm": {
        "rollout_is": "token",
        "rollout_is_threshold": 1.5,
        "rollout_is_batch_normalize": True,
    },
    "sequence_tis_batch_norm": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 4.0,
        "rollout_is_batch_normalize": True,
    },
    "rs_token_k1": {"rollout_is": None, "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_1.5"},
    "rs_token_k2_k3": {
        "rollout_is": None,
        "rollout_rs": "token_k2,token_k3",
        "rollout_rs_threshold": "0.05,0.06",
    },
    "rs_seq_sum": {
        "rollout_is": None,
        "rollout_rs": "seq_sum_k1,seq_sum_k2,seq_sum_k3",
        "rollout_rs_threshold": "0.3_3.0,0.2,0.25",
    },
    "rs_seq_mean": {
        "rollout_is": None,
        "rollout_rs": "seq_mean_k1,seq_mean_k2,seq_mean_k3",
        "rollout_rs_threshold": 1.2,
    },
    "rs_seq_max": {
        "rollout_is": None,
        "rollout_rs": "seq_max_k2,seq_max_k3",
        "rollout_rs_threshold": "0.1,0.2",
    },
    "tis+rs": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 3.0,
        "rollout_rs": "token_k3",
        "rollout_rs_threshold": 0.1,
    },
}
CORR_CASES = [{"id": f"corr/{k}", "kind": "corr", "name": k, "settings": v} for k, v in CORR_SETTINGS.items()]

KL_NAMES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+", "low_var_kl+", "abs+", "mse+"]
KL_CASES = [{"id": f"kl/{k}", "kind": "kl", "name": k} for k in KL_NAMES]

VALUE_CASES = [
    *({"id": f"value/{m}", "kind": "value", "name": m, "info": {}} for m in AGG_MODES),
    {"id": "value/token-mean+global", "kind": "value", "name": "token-mean", "info": GLOBAL_INFO},
]

ALL_CASES = ADV_CASES + LOSS_CASES + AGG_CASES + CORR_CASES + KL_CASES + VALUE_CASES
