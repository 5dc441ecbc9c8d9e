"""Record verl 0.9.1's algorithm math on seeded inputs, as the ground truth of ``test_verl091_parity.py``.

Runs every advantage estimator, policy loss (with every ``loss_agg_mode``, with rollout
importance weights, with global-batch normalisation), ``agg_loss`` mode, rollout-correction
setting, KL estimator and the value loss of verl 0.9.1's ``verl/trainer/ppo/core_algos.py``
and ``rollout_corr_helper.py`` on the inputs of :mod:`cases`, and writes the outputs and the
gradients (w.r.t. ``log_prob``, ``loss_mat`` or ``vpreds``) to ``verl091_outputs.pt`` next to
this file. The inputs are stored too, so the test can check it regenerates the same ones.

It must run in a separate environment holding the released verl 0.9.1 (never this repository's
``verl``; the script checks). From the repository root, on CPU::

    python3 -m venv /work/verl091
    /work/verl091/bin/pip install torch==2.13.0
    /work/verl091/bin/pip install --no-deps verl==0.9.1
    /work/verl091/bin/pip install numpy "tensordict==0.10.0" omegaconf hydra-core "ray>=2.41" \
        codetiming "transformers>=5.5.3,<5.11,!=5.6.0"
    /work/verl091/bin/python tests/trainer/ppo/verl_reference/record_verl.py

(``--no-deps`` because verl 0.9.1 pins ``transformers<5.11``, which this repository's
``constraints.txt`` excludes; only ``verl.trainer.ppo`` and its imports are needed.) Re-run it
only to move to another verl version, and commit the new ``verl091_outputs.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # for `cases` (the repository root stays off the path)

import cases  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask  # noqa: E402

import verl  # noqa: E402
from verl.config.algorithm import AlgoConfig, RolloutCorrectionConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

OUTPUT = HERE / "verl091_outputs.pt"
VALUE_CLIP = 0.5


def check_environment() -> None:
    repo_root = HERE.parents[3]
    if verl.__version__ != "0.9.1" or Path(verl.__file__).resolve().is_relative_to(repo_root):
        raise SystemExit(f"needs the released verl 0.9.1, found {verl.__version__} at {verl.__file__}")


def run_adv(case: dict, x: dict) -> dict:
    name = case["name"]
    fn = core_algos.get_adv_estimator_fn(name)
    rewards, mask = x["token_level_rewards"].clone(), x["response_mask"]
    index = cases.index(case.get("uids", "uids"))
    norm = case.get("norm_adv_by_std_in_grpo", True)
    config = AlgoConfig(
        gamma=case.get("gamma", 1.0),
        lam=case.get("lam", 1.0),
        norm_adv_by_std_in_grpo=norm,
        gdpo_reward_keys=case.get("gdpo_reward_keys"),
        gdpo_reward_weights=case.get("gdpo_reward_weights"),
    )
    if name == "gae":
        out = fn(rewards, x["values"], mask, config.gamma, config.lam)
    elif name in ("grpo", "grpo_vectorized"):
        out = fn(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    elif name == "gdpo":
        extra = {}
        if "gdpo_reward_keys" in case:
            non_tensor = {k: x[k].numpy().astype(np.float32) for k in cases.GDPO_KEYS}
            extra = {
                "non_tensor_batch": non_tensor,
                "batch": {k: x[k] for k in ("prompts", "attention_mask")},
            }
        out = fn(rewards, mask, index, norm_adv_by_std_in_grpo=norm, config=config, **extra)
    elif name == "remax":
        out = fn(rewards, x["reward_baselines"], mask, config=config)
    elif name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        weights = x["rollout_is_weights"] if case.get("with_is_weights") else None
        out = fn(rewards, mask, index, x["old_log_probs"], x["sum_pi_squared"], rollout_is_weights=weights)
    elif name == "reinforce_plus_plus":
        out = fn(rewards, mask, config=config)
    else:
        out = fn(rewards, mask, index, config=config)
    return {"advantages": out[0].clone(), "returns": out[1].clone()}


def actor_config(settings: dict, info: dict) -> ActorConfig:
    settings = dict(settings)
    policy = dict(settings.pop("policy_loss"))
    correction = policy.pop("rollout_correction", None)
    if correction is not None:
        policy["rollout_correction"] = RolloutCorrectionConfig(**correction)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(**policy),
        **settings,
    )
    config.global_batch_info.update(info)
    return config


def run_loss(case: dict, x: dict) -> dict:
    config = actor_config(case["actor"], case.get("info", {}))
    log_prob = x["log_prob"].clone().requires_grad_(True)
    weights = x["rollout_is_weights"] if case.get("with_is_weights") else None
    torch.manual_seed(cases.SEED)  # clip_cov draws its tokens at random
    loss, metrics = core_algos.get_policy_loss_fn(case["name"])(
        old_log_prob=x["old_log_probs"],
        log_prob=log_prob,
        advantages=x["advantages"],
        response_mask=x["response_mask"],
        loss_agg_mode=case["mode"],
        config=config,
        rollout_is_weights=weights,
    )
    loss.backward()
    return {"loss": loss.detach().clone(), "grad": log_prob.grad.clone(), "metrics": _floats(metrics)}


def run_agg(case: dict, x: dict) -> dict:
    loss_mat = x["loss_mat"].clone().requires_grad_(True)
    loss = core_algos.agg_loss(loss_mat, x["response_mask"], case["name"], **case["info"])
    loss.backward()
    return {"loss": loss.detach().clone(), "grad": loss_mat.grad.clone()}


def run_corr(case: dict, x: dict) -> dict:
    settings = {"rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False, "rollout_rs": None}
    settings.update(case["settings"])
    settings.setdefault("rollout_rs_threshold", None)
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=x["old_log_probs"],
        rollout_log_prob=x["rollout_log_probs"],
        response_mask=x["response_mask"],
        **settings,
    )
    out = {"response_mask": mask.clone(), "metrics": _floats(metrics)}
    if weights is not None:
        out["rollout_is_weights"] = weights.batch["rollout_is_weights"].clone()
    return out


def run_kl(case: dict, x: dict) -> dict:
    log_prob = x["log_prob"].clone().requires_grad_(True)
    kl = core_algos.kl_penalty(log_prob, x["ref_log_prob"], case["name"])
    kl.sum().backward()
    return {"kl": kl.detach().clone(), "grad": log_prob.grad.clone()}


def run_value(case: dict, x: dict) -> dict:
    vpreds = x["vpreds"].clone().requires_grad_(True)
    loss, clipfrac = core_algos.compute_value_loss(
        vpreds,
        x["returns"],
        x["values"],
        x["response_mask"],
        VALUE_CLIP,
        case["name"],
        **_value_info(case["info"]),
    )
    loss.backward()
    return {"loss": loss.detach().clone(), "clipfrac": clipfrac.detach().clone(), "grad": vpreds.grad.clone()}


def _value_info(info: dict) -> dict:
    return {k: v for k, v in info.items() if k != "loss_scale_factor" or v is not None}


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v.item() if isinstance(v, torch.Tensor) else v) for k, v in metrics.items()}


RUNNERS = {
    "adv": run_adv,
    "loss": run_loss,
    "agg": run_agg,
    "corr": run_corr,
    "kl": run_kl,
    "value": run_value,
}


def main() -> None:
    check_environment()
    torch.set_num_threads(1)
    inputs = cases.make_inputs()
    results = {}
    for case in cases.ALL_CASES:
        x = {k: v.clone() for k, v in inputs.items()}
        results[case["id"]] = RUNNERS[case["kind"]](case, x)
    torch.save(
        {
            "meta": {
                "verl": verl.__version__,
                "torch": str(torch.__version__),
                "seed": cases.SEED,
                "adv_estimators": sorted(core_algos.ADV_ESTIMATOR_REGISTRY),
                "policy_losses": sorted(core_algos.POLICY_LOSS_REGISTRY),
            },
            "inputs": inputs,
            "results": results,
        },
        OUTPUT,
    )
    print(f"wrote {len(results)} cases to {OUTPUT} ({OUTPUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
