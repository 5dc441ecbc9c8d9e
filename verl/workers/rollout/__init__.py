"""Rollout backends behind one interface (:class:`verl.workers.rollout.base.Rollout`)."""

from __future__ import annotations

import torch
from torch import nn

from verl.trainer.config.rollout import RolloutConfig
from verl.workers.rollout.base import Rollout


def build_rollout(
    config: RolloutConfig,
    module: nn.Module,
    pad_token_id: int,
    eos_token_ids: list[int],
    device: torch.device,
    seed: int,
) -> Rollout:
    """The backend named by ``rollout.name``; GPU-only engines are imported lazily."""
    if config.name == "hf":
        from verl.workers.rollout.hf_rollout import HFRollout

        return HFRollout(module, config, pad_token_id, eos_token_ids, device, seed)
    if config.name in ("vllm", "sglang"):
        raise NotImplementedError(
            f"actor_rollout_ref.rollout.name={config.name} needs the '{config.name}' extra and a CUDA GPU; "
            "it is not wired into this build yet. Use rollout.name=hf (in-process) instead."
        )
    raise NotImplementedError(f"actor_rollout_ref.rollout.name={config.name} is not available yet; use hf")


__all__ = ["Rollout", "build_rollout"]
