"""How a [B, R] matrix of per-token losses becomes one scalar (``loss_agg_mode``).

Kept apart from :mod:`verl.trainer.ppo.core_algos` (which re-exports it) so the policy
losses can use it without an import cycle.
"""

from __future__ import annotations

import torch

from verl.utils.torch_functional import masked_mean

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """Aggregate per-token losses ``l_{i,t}`` with mask ``m_{i,t}`` into a scalar.

    * ``token-mean``: ``sum_{i,t} m l / (sum_{i,t} m + 1e-8)`` (every token weighs the same; DAPO)
    * ``seq-mean-token-sum``: mean over rows of ``sum_t m l``
    * ``seq-mean-token-mean``: mean over rows of ``sum_t m l / (sum_t m + 1e-8)`` (original GRPO)
    * ``seq-mean-token-sum-norm``: ``sum_{i,t} m l / R`` with ``R`` the padded response
      length, a constant normaliser (Dr.GRPO, https://arxiv.org/abs/2503.20783)

    The two ``seq-mean`` modes average only over rows with at least one valid token.
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()
        return masked_mean(seq_losses, seq_mask)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_tokens = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_tokens + 1e-8)
        return masked_mean(seq_losses, (seq_tokens > 0).float())
    if loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        return torch.sum(seq_losses) / loss_mask.shape[-1]
    raise ValueError(f"loss_agg_mode: expected one of {list(LOSS_AGG_MODES)}, got {loss_agg_mode!r}")
