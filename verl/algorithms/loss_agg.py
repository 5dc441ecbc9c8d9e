"""How a [B, R] matrix of per-token losses becomes one scalar (``loss_agg_mode``).

Also the entropy loss, an aggregation of per-token entropies.

Global-batch normalisation (as verl 0.9.1): a mini-batch is split into micro-batches
(gradient accumulation) and over ``dp_size`` data-parallel ranks. Each micro-batch's loss
is normalised by the token or sequence count of the whole mini-batch on all ranks
(``batch_num_tokens``, ``global_batch_size``) and multiplied by ``dp_size`` (the ranks'
gradients are averaged), so the summed gradients equal the gradient of the mini-batch loss
whatever ``ppo_micro_batch_size_per_gpu`` or the number of ranks. Without these the
micro-batch's own counts are used (one micro-batch on one rank: the same value).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.utils.torch_functional import entropy_from_logits, masked_sum

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
SEQ_TOKEN_EPS = 1e-8
"""Added to a sequence's token count before dividing (seq-mean-token-mean)."""


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses ``l_{i,t}`` with mask ``m_{i,t}`` into a scalar.

    With ``N`` = ``batch_num_tokens`` (default ``sum m``), ``S`` = ``global_batch_size``
    (default: rows with a valid token) and ``D`` = ``dp_size``:

    * ``token-mean``: ``D * sum_{i,t} m l / N`` (every token weighs the same; DAPO,
      https://arxiv.org/abs/2503.14476)
    * ``token-sum``: ``D * sum_{i,t} m l``
    * ``seq-mean-token-sum``: ``D * sum_i (sum_t m l) / S``
    * ``seq-mean-token-mean``: ``D * sum_i (sum_t m l / (sum_t m + 1e-8)) / S`` (original GRPO)
    * ``seq-mean-token-sum-norm``: ``seq-mean-token-sum / loss_scale_factor``, by default the
      padded response length ``R`` (Dr.GRPO, https://arxiv.org/abs/2503.20783)

    Rows without a valid token add nothing. ``dp_size > 1`` needs the global counts.
    """
    if loss_agg_mode == "token-mean":
        count = _global_count(batch_num_tokens, dp_size, "batch_num_tokens", lambda: loss_mask.sum())
        return masked_sum(loss_mat, loss_mask) / count * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        seq_tokens = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = seq_losses / (seq_tokens + SEQ_TOKEN_EPS)
        seq_mask = (seq_tokens > 0).float()
        count = _global_count(global_batch_size, dp_size, "global_batch_size", lambda: seq_mask.sum())
        loss = masked_sum(seq_losses, seq_mask) / count * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1])
        return loss
    raise ValueError(f"loss_agg_mode: expected one of {list(LOSS_AGG_MODES)}, got {loss_agg_mode!r}")


def _global_count(value: Any, dp_size: int, name: str, local: Any) -> Any:
    if value is not None:
        return value
    if dp_size > 1:
        raise ValueError(
            f"agg_loss: {name} (of the whole mini-batch on all ranks) is needed when dp_size > 1"
        )
    return local()


def global_batch_info(config: Any) -> dict[str, Any]:
    """The ``agg_loss`` keyword arguments a loss should use: ``config.global_batch_info``
    (verl's attribute, set per micro-batch by the actor) or none."""
    return dict(getattr(config, "global_batch_info", None) or {})


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Aggregated entropy of ``softmax(logits)`` ([B, R, V]) over valid tokens (an entropy *bonus*:
    callers subtract ``entropy_coeff`` times it from the loss)."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode)
