"""The ``algorithm.*`` section and ``actor_rollout_ref.actor.policy_loss.*``.

Key names and defaults are verl's (``ppo_trainer.yaml`` and the DAPO recipe). The names
of advantage estimators, policy losses and KL estimators are checked against the
registries in :mod:`verl.trainer.ppo`, so a user-registered estimator or loss is accepted
as soon as the module that registers it has been imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from verl.config.base import (
    ANY_NUMBER,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    BaseConfig,
    ConfigError,
    at_least,
    between,
    check,
    check_choice,
    check_ranges,
    ranged,
)

KL_CTRL_TYPES = ("fixed", "adaptive")
PF_PPO_METHODS = ("pow", "max_min", "max_random")


@dataclass
class KLControlConfig(BaseConfig):
    type: str = "fixed"
    """KL coefficient controller for the in-reward penalty: fixed | adaptive (https://arxiv.org/abs/1909.08593)."""
    kl_coef: float = ranged(0.001, NON_NEGATIVE)
    """Initial (or fixed) KL coefficient beta."""
    horizon: int = ranged(10000, POSITIVE)
    """Adaptive controller: number of samples over which beta moves towards its target."""
    target_kl: float = ranged(0.1, POSITIVE)
    """Adaptive controller: the KL value beta is steered to."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check_choice(self.type, KL_CTRL_TYPES, f"{path}.type")


@dataclass
class FilterGroupsConfig(BaseConfig):
    enable: bool = False
    """DAPO dynamic sampling: drop prompt groups whose responses all got the same metric value."""
    metric: str | None = None
    """Per-response value compared within a group: seq_reward, seq_final_reward, or a scorer output key (acc, score, ...)."""
    max_num_gen_batches: int = ranged(0, at_least(0, also=(-1,)))
    """Most generation batches drawn to fill one training batch; 0 (or -1) means no limit."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        if self.enable:
            check(
                bool(self.metric),
                f"{path}.metric",
                "a metric name when filter_groups.enable=True",
                self.metric,
            )


@dataclass
class PFPPOConfig(BaseConfig):
    reweight_method: str = "pow"
    """How scores become resampling weights: pow (|score|^weight_pow) | max_min | max_random."""
    weight_pow: float = ranged(2.0, NON_NEGATIVE)
    """Exponent of the pow method."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check_choice(self.reweight_method, PF_PPO_METHODS, f"{path}.reweight_method")


ROLLOUT_IS_LEVELS = (None, "token", "sequence")
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")
SUM_PI_SQUARED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


@dataclass
class RolloutCorrectionConfig(BaseConfig):
    rollout_is: str | None = None
    """Importance weights pi_old / pi_rollout on every policy loss: null (none) | token | sequence (https://richardli.xyz/rl-collapse)."""
    rollout_is_threshold: float | int | str | None = 2.0
    """A number u truncates the weights at u (TIS); "l_u" zeroes weights outside [l, u] (IcePop; write 0.5_2.0); null: no weights, whatever rollout_is says (as verl)."""
    rollout_is_batch_normalize: bool = False
    """Divide the weights by their batch mean (over tokens, or over responses at sequence level)."""
    rollout_rs: str | None = None
    """Rejection: comma-separated token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3 (null: none)."""
    rollout_rs_threshold: float | int | str | None = None
    """One threshold per rollout_rs option (or one for all): k1 options "l_u" or u (l = 1/u), others an upper bound."""
    bypass_mode: bool = False
    """Use rollout_log_probs as old_log_probs (two policies, no old-log-prob pass); weights and rejection then apply inside the actor's loss."""
    loss_type: str = "ppo_clip"
    """Loss of bypass mode: ppo_clip (PPO against pi_rollout) | reinforce (REINFORCE with the importance weights)."""

    def validate(self, path: str) -> None:
        from verl.algorithms.rollout_correction import (
            parse_is_threshold,
            parse_rs_options,
            parse_rs_thresholds,
        )

        check(
            self.rollout_is in ROLLOUT_IS_LEVELS,
            f"{path}.rollout_is",
            "null, token or sequence",
            self.rollout_is,
        )
        check_choice(self.loss_type, BYPASS_LOSS_TYPES, f"{path}.loss_type")
        if self.rollout_is_threshold is not None:
            _parsed(parse_is_threshold, f"{path}.rollout_is_threshold", self.rollout_is_threshold)
        if self.rollout_rs is not None:
            options = _parsed(parse_rs_options, f"{path}.rollout_rs", self.rollout_rs)
            _parsed(
                lambda v: parse_rs_thresholds(options, v),
                f"{path}.rollout_rs_threshold",
                self.rollout_rs_threshold,
            )


def _parsed(parse: Callable[[Any], Any], key: str, value: Any) -> Any:
    """``parse(value)``, its ValueError turned into a ConfigError that names the full key."""
    try:
        return parse(value)
    except ValueError as error:
        message = str(error).removeprefix(f"{key.rsplit('.', 1)[-1]}: ")
        raise ConfigError(f"{key}: {message}") from error


@dataclass
class AlgorithmConfig(BaseConfig):
    gamma: float = ranged(1.0, FRACTION)
    """Discount factor (GAE and REINFORCE++)."""
    lam: float = ranged(1.0, FRACTION)
    """GAE lambda: bias/variance trade-off of the advantage (https://arxiv.org/abs/1506.02438)."""
    adv_estimator: str = "gae"
    """Advantage estimator: gae | grpo | grpo_vectorized | gdpo | grpo_passk | rloo | rloo_vectorized | reinforce_plus_plus | reinforce_plus_plus_baseline | remax | opo | gpg, or a registered name."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide by the group std; False gives Dr.GRPO (https://arxiv.org/abs/2503.20783)."""
    use_kl_in_reward: bool = False
    """Subtract beta * KL(actor || ref) from the token rewards before computing advantages."""
    kl_penalty: str = "kl"
    """KL estimator of the in-reward penalty: kl|k1, abs, mse|k2, low_var_kl|k3 (and k1+, k3+)."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """Controller of the in-reward KL coefficient."""
    use_pf_ppo: bool = False
    """Policy-filtration PPO (PF-PPO): resample the batch by reward after GAE (https://arxiv.org/abs/2409.06957)."""
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    """Options of pf-PPO resampling."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling (https://arxiv.org/abs/2503.14476)."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights and rejection for rollouts from another policy (needs rollout.calculate_log_probs)."""
    gdpo_reward_keys: list[str] | None = None
    """gdpo: reward columns (returned by the reward function) normalised one by one (https://arxiv.org/abs/2601.05242)."""
    gdpo_reward_weights: list[float] | None = None
    """gdpo: weight of each of gdpo_reward_keys in the sum (null: all 1)."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        # Imported here: the registries import this module for type hints.
        from verl.algorithms.advantages import ADV_ESTIMATOR_REGISTRY
        from verl.algorithms.kl import KL_PENALTY_TYPES

        check_choice(self.adv_estimator, ADV_ESTIMATOR_REGISTRY, f"{path}.adv_estimator")
        check_choice(self.kl_penalty, KL_PENALTY_TYPES, f"{path}.kl_penalty")
        self.kl_ctrl.validate(f"{path}.kl_ctrl")
        self.pf_ppo.validate(f"{path}.pf_ppo")
        self.filter_groups.validate(f"{path}.filter_groups")
        self.rollout_correction.validate(f"{path}.rollout_correction")
        self._check_estimator_inputs(path)

    def _check_estimator_inputs(self, path: str) -> None:
        if self.adv_estimator == "gdpo":
            check(
                bool(self.gdpo_reward_keys), f"{path}.gdpo_reward_keys", "reward column names for gdpo", None
            )
        weights, keys = self.gdpo_reward_weights, self.gdpo_reward_keys or []
        check(
            weights is None or len(weights) == len(keys),
            f"{path}.gdpo_reward_weights",
            f"one weight per gdpo_reward_keys entry ({len(keys)})",
            weights,
        )


# verl's class name, for code written against it.
AlgoConfig = AlgorithmConfig


@dataclass
class PolicyLossConfig(BaseConfig):
    loss_mode: str = "vanilla"
    """Policy loss: vanilla | gspo | sapo | dppo_tv | dppo_kl | clip_cov | kl_cov | gpg | geo_mean | dro | cispo, or a registered name."""
    clip_cov_ratio: float = ranged(0.0002, between(0, 1, low_open=True))
    """clip_cov: fraction of tokens whose gradient is detached (https://arxiv.org/abs/2505.22617)."""
    clip_cov_lb: float = ranged(1.0, ANY_NUMBER)
    """clip_cov: lower bound of the covariance for a token to be a candidate."""
    clip_cov_ub: float = ranged(5.0, ANY_NUMBER)
    """clip_cov: upper bound of the covariance for a token to be a candidate."""
    kl_cov_ratio: float = ranged(0.0002, between(0, 1, low_open=True))
    """kl_cov: fraction of tokens (largest covariance) that get the KL penalty."""
    ppo_kl_coef: float = ranged(0.1, NON_NEGATIVE)
    """kl_cov: coefficient of the |log-ratio| penalty on the selected tokens."""
    dro_beta: float | None = ranged(None, POSITIVE)
    """dro: weight of the quadratic log-ratio penalty beta / 2 * (log pi - log pi_old)^2 (required for dro)."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """A copy of algorithm.rollout_correction made at start-up, as verl's trainer does (the actor's bypass-mode loss reads it); set algorithm.rollout_correction.* instead."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        from verl.algorithms.policy_losses import POLICY_LOSS_REGISTRY

        check_choice(self.loss_mode, POLICY_LOSS_REGISTRY, f"{path}.loss_mode")
        check(
            self.clip_cov_lb < self.clip_cov_ub,
            f"{path}.clip_cov_lb",
            f"less than clip_cov_ub={self.clip_cov_ub}",
            self.clip_cov_lb,
        )
        if self.loss_mode == "dro":
            check(
                self.dro_beta is not None and self.dro_beta > 0,
                f"{path}.dro_beta",
                "a positive number for loss_mode=dro",
                self.dro_beta,
            )
        check(
            self.loss_mode != "bypass_mode",
            f"{path}.loss_mode",
            "not bypass_mode (set algorithm.rollout_correction.bypass_mode=True instead)",
            self.loss_mode,
        )
