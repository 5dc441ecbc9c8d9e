"""Log-probs and entropy from vocab-parallel logits, without gathering the vocabulary.

Under tensor parallelism megatron-core's output layer gives each rank the logits of its own slice
of the vocabulary (``[b, R, V / T]``, rank ``r`` holding ids ``r V / T`` to ``(r + 1) V / T - 1``).
The softmax needs three numbers per position from every slice, so three small all-reduces over the
tensor-parallel group replace the all-gather of ``b x R x V`` logits:

* the maximum logit (shifts every slice alike; a constant, so no gradient flows through it),
* ``Z = sum_v exp(l_v - max)``,
* the shifted logit of the label (from the one rank whose slice holds it, zero elsewhere),

and for the entropy ``sum_v exp(l_v - max) (l_v - max)``. Then ``log p(label) = l_label - max -
log Z`` and ``H = log Z - sum_v p_v (l_v - max)``. Every rank of the group computes the same loss
from these, and the all-reduces pass gradients straight through in backward (megatron-core's
``reduce_from_tensor_model_parallel_region``): each rank's slice gets the gradient of its own
logits, as a single rank holding every logit would compute it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum over the tensor-parallel group in forward, identity in backward."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(x)


def _shifted(
    logits: torch.Tensor, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(l - max, exp(l - max), Z)`` of this rank's slice, with the group's maximum and ``Z``."""
    top = logits.detach().amax(-1)
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - top.unsqueeze(-1)
    exp = shifted.exp()
    return shifted, exp, _reduce(exp.sum(-1))


def log_probs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, group: dist.ProcessGroup, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(labels)`` ``[b, R]`` from this rank's fp32 logits slice ``[b, R, V / T]``, and the
    entropy ``[b, R]`` when asked; equal to the full-vocabulary values to fp32 rounding."""
    shifted, exp, total = _shifted(logits, group)
    width = logits.shape[-1]
    local = labels - dist.get_rank(group) * width
    mine = (local >= 0) & (local < width)
    picked = shifted.gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
    log_total = total.log()
    log_probs = _reduce(torch.where(mine, picked, torch.zeros_like(picked))) - log_total
    if not entropy:
        return log_probs, None
    return log_probs, log_total - _reduce((exp * shifted).sum(-1)) / total


def sum_pi_squared(logits: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``sum_v p_v^2`` ``[b, R]`` of each position's distribution (outside autograd)."""
    with torch.no_grad():
        _, exp, total = _shifted(logits, group)
        return _reduce(exp.square().sum(-1)) / total.square()
