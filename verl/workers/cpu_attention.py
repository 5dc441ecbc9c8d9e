"""Attention for models computing on CPU under bf16 autocast: the model's own eager attention while a
call's score matrix is small, torch's SDPA beyond.

Torch's CPU flash kernel (what SDPA runs there) does its block products as fp32 matrix products,
while the layers around it run bf16 products at several times the speed: on SmolLM2-135M (32 rows
of 171 tokens, 2 cores) it took 2.8 s of a 9.6 s forward+backward for about 4% of the FLOPs, and
the model's eager attention (two bf16 matrix products around an fp32 softmax) brought the whole to
7.0 s against 8.4 s, with the same error against fp32. Eager attention holds the ``[b, H, L, S]``
scores, though, so a call whose scores would exceed :data:`EAGER_SCORES_MAX` entries runs SDPA
instead: long sequences keep SDPA's memory, which grows with ``L``, not ``L * S``.

Registered with transformers' attention interface as :data:`CPU_ATTENTION`; masks are the eager
path's additive float masks, which SDPA takes as well.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch import nn

from verl.config.engine import FSDPConfig
from verl.workers.engine.fsdp import torch_dtype

CPU_ATTENTION = "verl_cpu"

EAGER_SCORES_MAX = 1 << 24
"""Score entries (``batch * heads * queries * keys``) up to which a call runs eager attention:
64 MB of fp32 scores (SmolLM2's 32 x 171-token micro-batch needs 8.4M)."""


def default_attention(device: torch.device, fsdp: FSDPConfig) -> str | None:
    """The attention implementation a model an engine with ``fsdp`` trains or runs loads with, unless
    the model's ``override_config.attn_implementation`` names one (None: transformers' default,
    SDPA): :data:`CPU_ATTENTION` on CPU under bf16 autocast (actor, reference, critic, SFT). fp32
    keeps SDPA (its numbers pinned)."""
    low_precision = torch_dtype(fsdp.mixed_precision.param_dtype) != torch.float32
    if device.type == "cpu" and fsdp.mixed_precision.cpu_autocast and low_precision:
        return register()
    return None


@functools.cache
def register() -> str:
    """Register :data:`CPU_ATTENTION` with transformers (once) and return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(CPU_ATTENTION, cpu_attention_forward)
    AttentionMaskInterface.register(CPU_ATTENTION, eager_mask)
    return CPU_ATTENTION


def cpu_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, *args, **kwargs):
    """transformers' attention-function contract (``query`` ``[b, H, L, D]``, ``key``/``value``
    ``[b, H_kv, S, D]``, then the mask; ``dropout`` and ``scaling`` among the keywords): returns
    ``[b, L, H, D]`` and, from the eager path, the weights."""
    batch, heads, length, _ = query.shape
    eager = _model_eager_attention(type(module))
    if eager is not None and batch * heads * length * key.shape[2] <= EAGER_SCORES_MAX:
        if kwargs.get("scaling") is None:  # the eager functions take it as given
            kwargs["scaling"] = query.shape[-1] ** -0.5
        return eager(module, query, key, *args, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, *args, **kwargs)


@functools.cache
def _model_eager_attention(attention_class: type):
    """The eager attention function of the module's modeling file (transformers defines one per
    model, with the model's own details); None if it has none."""
    return getattr(sys.modules.get(attention_class.__module__), "eager_attention_forward", None)
