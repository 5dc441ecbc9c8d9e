"""``dapo``: per-response scoring plus DAPO's soft overlong punishment (Yu et al. 2025,
arXiv:2503.14476, eq. 13).

With ``L_max = max_resp_len`` and buffer ``L_cache = overlong_buffer.len``, a response of
``|y|`` valid tokens gets

    R_length(y) = 0                                     if |y| <= L_max - L_cache
                = (L_max - L_cache - |y|) / L_cache * f  otherwise   (f = penalty_factor)

added to its score, i.e. a penalty growing linearly from 0 to ``-f`` across the buffer.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.config.base import ConfigError
from verl.config.reward import OverlongBufferConfig
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.registry import register

__all__ = ["DAPORewardManager", "overlong_penalty"]


def overlong_penalty(
    lengths: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """DAPO's length reward per row (<= 0): ``min(0, (max_resp_len - buffer_len - |y|) / buffer_len * f)``."""
    expected_len = max_resp_len - buffer_len
    exceed = lengths.to(torch.float32) - expected_len
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


@register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """Naive scoring, then the overlong penalty when ``overlong_buffer_cfg.enable``."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Any = None,
        reward_fn_key: str = "data_source",
        max_resp_len: int | None = None,
        overlong_buffer_cfg: OverlongBufferConfig | None = None,
        num_workers: int = 0,
        timeout_s: float = 10.0,
    ) -> None:
        self.overlong_buffer_cfg = overlong_buffer_cfg or OverlongBufferConfig()
        self.max_resp_len = max_resp_len
        if self.overlong_buffer_cfg.enable:
            _check_buffer(self.overlong_buffer_cfg, max_resp_len)
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, num_workers, timeout_s)

    def shape_rewards(
        self, rewards: torch.Tensor, lengths: torch.Tensor, extra: dict[str, list[Any]]
    ) -> torch.Tensor:
        cfg = self.overlong_buffer_cfg
        if not cfg.enable:
            return rewards
        penalty = overlong_penalty(lengths, self.max_resp_len, cfg.len, cfg.penalty_factor)
        if cfg.log:
            extra["overlong_reward"] = penalty.tolist()
            extra["overlong"] = (penalty < 0).tolist()
        return rewards + penalty


def _check_buffer(cfg: OverlongBufferConfig, max_resp_len: int | None) -> None:
    if max_resp_len is None or max_resp_len <= 0:
        raise ConfigError(
            f"data.max_response_length: expected a positive length for the overlong buffer, got {max_resp_len!r}"
        )
    if not 0 < cfg.len <= max_resp_len:
        raise ConfigError(
            f"reward_model.overlong_buffer.len: expected 0 < len <= data.max_response_length ({max_resp_len}), got {cfg.len!r}"
        )
