"""Small tensor helpers shared by the algorithm code and the workers.

Every function here matches verl's ``verl/utils/torch_functional.py`` numerically (same
epsilons, same biased/unbiased choices) so that advantages and losses agree with runs of
the well-known implementation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

# Added to every masked denominator so an all-zero mask gives 0 instead of NaN.
MASK_EPS = 1e-8
# Added to the variance before the inverse square root in whitening.
WHITEN_EPS = 1e-8


def masked_sum(
    values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero (weighted by the mask).

    Entries outside the mask are replaced by 0 first, so a NaN or inf there (e.g. a
    log-prob of padding) cannot leak into the sum.
    """
    valid = torch.where(mask.bool(), values, 0.0)
    return (valid * mask).sum(dim=axis)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor, axis: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """``sum(values * mask) / (sum(mask) + 1e-8)`` over ``axis`` (all elements when None)."""
    return masked_sum(values, mask, axis) / (mask.sum(dim=axis) + MASK_EPS)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries: ``mean((x - mean(x))^2)``, times ``n / (n - 1)`` if unbiased.

    ``n`` is ``sum(mask)``. With ``unbiased=True`` a mask holding zero or one element is
    an error (the Bessel correction would divide by zero), as in verl.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if not unbiased:
        return variance
    count = mask.sum()
    if count == 0:
        raise ValueError(
            "masked_var: the mask selects no element; at least two are needed for an unbiased variance"
        )
    if count == 1:
        raise ValueError(
            "masked_var: the mask selects a single element, so the unbiased variance divides by zero; "
            "use a larger batch (more valid tokens) for whitening"
        )
    return variance * (count / (count - 1))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` with masked mean and unbiased masked variance.

    With ``shift_mean=False`` the mean is added back (only the scale is normalised).
    Entries outside the mask are transformed too; callers multiply by the mask.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """``clamp`` with tensor-valued bounds: ``max(min(x, tensor_max), tensor_min)``."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[..., labels]``: log-probability of each label, shape ``labels.shape``.

    Rollout backends and the trainer both call this function, so the behaviour log-probs
    and the recomputed ones are the same computation (on CPU in fp32 equal within 1e-5, bit-exact
    on some CPUs).
    """
    logp = F.log_softmax(logits, dim=-1)
    return torch.gather(logp, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last axis: ``logsumexp(z) - sum(softmax(z) * z)``."""
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(probs * logits, dim=-1)


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """:func:`entropy_from_logits` over ``chunk_size`` positions at a time: the softmax of only one
    chunk is alive at once (verl's ``entropy_from_logits_with_chunking``). Same values."""
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [entropy_from_logits(chunk) for chunk in flat.split(chunk_size)]
    return torch.cat(parts).reshape(logits.shape[:-1])


def get_response_mask(
    response_ids: torch.Tensor, eos_token: int | list[int], dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """1 on response tokens up to and including the first EOS of each row, 0 after it.

    ``eos_token`` may be one id or a list of ids (any of them ends the response).
    """
    eos = torch.isin(response_ids, torch.tensor(eos_token, device=response_ids.device)).int()
    # cumsum - eos counts the EOS tokens strictly before each position.
    return (eos.cumsum(dim=1) - eos).eq(0).to(dtype)


def pad_sequence_to_length(
    tensors: torch.Tensor, max_seq_len: int, pad_token_id: int | float, left_pad: bool = False
) -> torch.Tensor:
    """Pad the last axis of ``tensors`` with ``pad_token_id`` up to ``max_seq_len`` (on the left with
    ``left_pad``); a tensor already that long or longer comes back unchanged."""
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    return F.pad(tensors, (missing, 0) if left_pad else (0, missing), "constant", pad_token_id)


# ---------------------------------------------------------------------------- LR schedules
def get_constant_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """The optimizer's LR times ``step / num_warmup_steps`` during warmup, then times 1."""

    def factor(step: int) -> float:
        return step / max(1.0, num_warmup_steps) if step < num_warmup_steps else 1.0

    return LambdaLR(optimizer, factor, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    init_lr_ratio: float | None = None,
) -> LambdaLR:
    """Linear warmup from ``init_lr_ratio`` (default 0) to 1, then a cosine from 1 down to
    ``min_lr_ratio`` over the remaining steps (``num_cycles=0.5``: half a period), never below it:
    ``max(m, m + (1 - m) * (1 + cos(2 pi num_cycles progress)) / 2)``."""
    floor = min_lr_ratio or 0.0
    start = init_lr_ratio or 0.0
    if not (0.0 <= floor <= 1.0 and 0.0 <= start <= 1.0):
        raise ValueError(
            f"min_lr_ratio and init_lr_ratio must lie in [0, 1], got {min_lr_ratio}, {init_lr_ratio}"
        )

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return start + (1.0 - start) * step / max(1, num_warmup_steps)
        progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
        cosine = math.cos(2.0 * math.pi * num_cycles * progress)
        return max(floor, floor + (1.0 - floor) * 0.5 * (1.0 + cosine))

    return LambdaLR(optimizer, factor, last_epoch)
