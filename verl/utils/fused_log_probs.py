"""Log-probs and entropy of the response tokens in one Triton pass over the LM head's outputs.

The eager path (:func:`verl.workers.forward.response_token_log_probs`) casts each chunk of the
head's bf16 outputs to fp32, runs a log-softmax, gathers the label's entry, and in backward does it
all again before the log-softmax's own backward and a cast back to bf16: about 46 bytes of memory
traffic per vocabulary entry. Here one kernel reads each row once (an online log-sum-exp, as in
flash attention, that also carries ``sum p * x`` for the entropy) and the backward kernel reads it
once more and writes its gradient straight in the head's dtype: 6 bytes per entry. The math is
fp32 throughout, as in the eager path; only the order of the sums differs.

For a row ``x`` (the head's outputs divided by the temperature ``T``) and its label ``y``::

    lse = log sum_v exp(x_v)         log_prob = x_y - lse       p_v = exp(x_v - lse)
    entropy = lse - sum_v p_v x_v
    d log_prob / d x_v = 1[v = y] - p_v      d entropy / d x_v = p_v (sum_u p_u x_u - x_v)

and the head's gradient is those, weighted by the incoming gradients, divided by ``T``.

Used on CUDA when Triton is importable (:data:`FUSED_LOG_PROBS` switches it off, for benchmarks);
``TRITON_INTERPRET=1`` runs the same kernels on CPU tensors for debugging.
"""

from __future__ import annotations

import functools
import os

import torch

FUSED_LOG_PROBS = True
"""Whether CUDA runs use these kernels (False: the eager chunked path everywhere)."""

BLOCK = 4096
"""Vocabulary entries one program handles per loop step."""


def available(head: torch.Tensor) -> bool:
    """Whether the fused kernels can run on ``head`` here."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return FUSED_LOG_PROBS and (head.is_cuda or interpreted) and _kernels() is not None


def log_probs_and_entropy(
    head: torch.Tensor, labels: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``log_probs`` and ``entropy``, each shaped like ``labels``, of the distributions
    ``softmax(head / temperature)`` over the last dimension (temperature 0 or 1: the head as is),
    differentiable in ``head``."""
    if head.dim() not in (2, 3) or head.shape[:-1] != labels.shape:
        raise ValueError(
            f"log_probs_and_entropy: head {tuple(head.shape)} and labels {tuple(labels.shape)} do not match"
        )
    scale = 1.0 if temperature in (0, 1) else 1.0 / temperature
    batched = head if head.dim() == 3 else head[None]  # [b, R, V], any strides over b and R
    if batched.stride(-1) != 1:
        batched = batched.contiguous()
    log_probs, entropy = _LogProbEntropy.apply(batched, labels.reshape(-1), scale)
    return log_probs.view(labels.shape), entropy.view(labels.shape)


class _LogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, head: torch.Tensor, labels: torch.Tensor, scale: float):
        fwd, _ = _kernels()
        b, length, vocab = head.shape
        labels = labels.contiguous()
        log_probs = torch.empty(b * length, dtype=torch.float32, device=head.device)
        entropy = torch.empty_like(log_probs)
        lse = torch.empty_like(log_probs)
        starts = _row_starts(head)
        fwd[(b * length,)](
            head, starts, labels, log_probs, entropy, lse, vocab, scale, BLOCK=BLOCK, num_warps=8
        )
        ctx.save_for_backward(head, starts, labels, lse, entropy)
        ctx.scale = scale
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        _, bwd = _kernels()
        head, starts, labels, lse, entropy = ctx.saved_tensors
        b, length, vocab = head.shape
        zeros = torch.zeros(b * length, dtype=torch.float32, device=head.device)
        g_lp = zeros if grad_log_probs is None else grad_log_probs.float().contiguous()
        g_ent = zeros if grad_entropy is None else grad_entropy.float().contiguous()
        grad = torch.empty((b, length, vocab), dtype=head.dtype, device=head.device)
        args = (head, starts, labels, lse, entropy, g_lp, g_ent, grad, vocab, ctx.scale)
        bwd[(b * length,)](*args, BLOCK=BLOCK, num_warps=8)
        return grad, None, None


def _row_starts(head: torch.Tensor) -> torch.Tensor:
    """int64 ``[b * R]``: where each row of ``head`` ``[b, R, V]`` starts, in elements."""
    b, length, _ = head.shape
    index = torch.arange(b, device=head.device)[:, None] * head.stride(0)
    return (index + torch.arange(length, device=head.device) * head.stride(1)).flatten()


@functools.cache
def _kernels():
    """The forward and backward kernels, compiled on first use; None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def forward(head, starts, labels, log_probs, entropy, lse_out, vocab, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = head + tl.load(starts + row)
        m = float("-inf")  # running max
        s = 0.0  # sum exp(x - m)
        t = 0.0  # sum exp(x - m) * x
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            x = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32) * scale
            m_new = tl.maximum(m, tl.max(x, 0))
            e = tl.where(inside, tl.exp(x - m_new), 0.0)
            rescale = tl.exp(m - m_new)
            s = s * rescale + tl.sum(e, 0)
            t = t * rescale + tl.sum(e * tl.where(inside, x, 0.0), 0)
            m = m_new
        lse = m + tl.log(s)
        label = tl.load(labels + row)
        x_label = tl.load(base + label).to(tl.float32) * scale
        tl.store(log_probs + row, x_label - lse)
        tl.store(entropy + row, lse - t / s)
        tl.store(lse_out + row, lse)

    @triton.jit
    def backward(head, starts, labels, lse_in, entropy, g_lp, g_ent, grad, vocab, scale, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = head + tl.load(starts + row)
        out = grad + row.to(tl.int64) * vocab
        lse = tl.load(lse_in + row)
        mean_x = lse - tl.load(entropy + row)  # sum_v p_v x_v
        d_lp = tl.load(g_lp + row)
        d_ent = tl.load(g_ent + row)
        label = tl.load(labels + row)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            x = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32) * scale
            p = tl.exp(x - lse)
            g = p * (d_ent * (mean_x - x) - d_lp) + tl.where(cols == label, d_lp, 0.0)
            tl.store(out + cols, (g * scale).to(grad.dtype.element_ty), mask=inside)

    return forward, backward
