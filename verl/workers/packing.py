"""Packed sequences (``model.use_remove_padding``): a micro-batch runs as one row without pads.

A padded micro-batch ``[b, L]`` becomes one row of its ``T = attention_mask.sum()`` real tokens,
each sequence keeping its own position ids, and attention is confined to each sequence by the
cumulative lengths ``cu_seqlens``. The model then spends no FLOPs on pads, and a token budget
(``use_dynamic_bsz``) buys exactly its number of real tokens.

Attention runs through :data:`PACKED_ATTENTION`, an implementation registered with transformers'
attention interface: on CUDA with bf16/fp16 it calls torch's variable-length flash attention
(no ``T x T`` mask, no work across sequences); elsewhere (CPU, fp32) it runs causal SDPA on each
sequence in turn. A call without ``cu_seqlens`` (a padded batch, ``generate``) runs plain
SDPA, so a module switched to it still serves every other caller unchanged.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from verl.utils.mrope import model_position_ids
from verl.workers import ulysses
from verl.workers.vision import vision_kwargs

PACKED_ATTENTION = "verl_packed"


@dataclass
class PackedBatch:
    """One micro-batch packed into a single row."""

    input_ids: torch.Tensor
    """``[1, T]`` the real tokens of every sequence, back to back."""
    position_ids: torch.Tensor
    """``[1, T]`` each token's position in its own sequence (``[3, 1, T]`` under M-RoPE)."""
    cu_seqlens: torch.Tensor
    """``[b + 1]`` int32: sequence ``i`` is ``[cu_seqlens[i], cu_seqlens[i + 1])``."""
    max_seqlen: int
    """The longest sequence's length."""
    packed_at: torch.Tensor
    """``[b, L]``: each padded position's place in the packed row (a pad's points at the real token
    before it in the flattened batch, so an output read there is finite and masked later)."""
    vision: dict[str, torch.Tensor] = field(default_factory=dict)
    """The micro-batch's image inputs (:mod:`verl.workers.vision`), whose tokens keep their order."""

    def model_kwargs(self) -> dict:
        cu, longest = self.cu_seqlens, self.max_seqlen
        return {
            **self.vision,
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": longest,
            "max_length_k": longest,
            "use_cache": False,
        }

    def response_index(self, response_length: int) -> torch.Tensor:
        """``[b, R]``: the packed position whose output predicts each of the last ``R`` tokens of a row."""
        length = self.packed_at.shape[1]
        return self.packed_at[:, length - response_length - 1 : length - 1].clamp(min=0)


def pack(micro: dict[str, torch.Tensor]) -> PackedBatch:
    """Pack a padded micro-batch (``input_ids``, ``attention_mask``, ``position_ids``)."""
    mask = micro["attention_mask"].bool()
    shape = tuple(micro["position_ids"].shape)
    if len(shape) not in (2, 3) or (shape[0], shape[-1]) != tuple(mask.shape):
        raise ValueError(
            f"use_remove_padding: position_ids of shape {shape} do not fit the batch {tuple(mask.shape)} "
            "(expected [batch, length], or [batch, 3, length] for M-RoPE)"
        )
    lengths = mask.sum(-1)
    host_lengths = lengths.cpu()  # the one host sync: sizes below are known without another
    if bool((host_lengths == 0).any()):
        raise ValueError("use_remove_padding: a row has no tokens (attention_mask is all zero)")
    flat = mask.flatten()
    real = torch.argsort((~flat).to(torch.int8), stable=True)[
        : int(host_lengths.sum())
    ]  # real tokens, in order
    positions = model_position_ids(micro["position_ids"])  # [b, L], or [3, b, L] (M-RoPE)
    return PackedBatch(
        input_ids=micro["input_ids"].flatten()[real][None],
        position_ids=positions.flatten(-2)[..., real].unsqueeze(-2),
        cu_seqlens=F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32),
        max_seqlen=int(host_lengths.max()),
        packed_at=flat.long().cumsum(0).view(mask.shape) - 1,
        vision=vision_kwargs(micro),
    )


def outputs_at(module: nn.Module, packed: PackedBatch, index: torch.Tensor, causal_lm: bool) -> torch.Tensor:
    """The model's outputs ``[*index.shape, C]`` at the packed positions ``index``, the whole row run
    once; a ``causal_lm`` runs its LM head on those positions only (``logits_to_keep``). Under
    :func:`verl.workers.ulysses.sequence_parallel` the row is split over the group and every rank
    gets all of them."""
    if ulysses.active():
        return ulysses.outputs_at(module, packed, index, causal_lm)
    if causal_lm:
        out = module(**packed.model_kwargs(), logits_to_keep=index.flatten())
        return out.logits[0].view(*index.shape, -1)
    return module(**packed.model_kwargs()).logits[0][index]


def packed_response_outputs(
    module: nn.Module, micro: dict[str, torch.Tensor], causal_lm: bool = False
) -> torch.Tensor:
    """The head's outputs ``[b, R, C]`` at the positions that predict each response token, computed on
    the packed row."""
    packed = pack(micro)
    return outputs_at(module, packed, packed.response_index(micro["responses"].shape[1]), causal_lm)


def enable_packing(module: nn.Module) -> nn.Module:
    """Switch a transformers model to :data:`PACKED_ATTENTION` (registered on first use)."""
    _register()
    config = getattr(module, "config", None)
    implementation: str | dict = PACKED_ATTENTION
    if getattr(config, "vision_config", None) is not None:  # the vision tower attends within each image
        implementation = {"text_config": PACKED_ATTENTION, "vision_config": "sdpa"}
    try:
        module.set_attn_implementation(implementation)
    except (AttributeError, ValueError) as err:
        raise ValueError(
            f"use_remove_padding: {type(module).__name__} cannot run packed sequences: it does not take a "
            f"pluggable attention implementation ({err}); set use_remove_padding=False"
        ) from err
    return module


_REGISTERED = False


def _register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def mask(*args, attention_mask=None, **kwargs):
        # packed calls (and unpadded ones) carry no 2-D mask: attention needs none beyond cu_seqlens/causal
        if attention_mask is None:
            return None
        return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, mask)
    _REGISTERED = True


def packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` ``[b, H, T, D]``, ``key``/``value``
    ``[b, H_kv, T, D]``; returns ``[b, T, H, D]``."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if dropout:
        raise ValueError("use_remove_padding: packed attention runs without attention dropout")
    if ulysses.active():  # this rank holds a slice of the row: attention runs on a share of the heads
        return ulysses.attention(_attend, query, key, value, scaling), None
    return _attend(query, key, value, cu, int(kwargs["max_length_q"]), scaling), None


def _attend(query, key, value, cu_seqlens, max_seqlen: int, scaling) -> torch.Tensor:
    """Attention within each sequence of the packed row: ``[1, H, T, D]`` in, ``[1, T, H, D]`` out."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, D]
    if q.is_cuda and torch.is_autocast_enabled("cuda"):  # as autocast casts SDPA's inputs (RoPE left fp32)
        q, k, v = (t.to(torch.get_autocast_dtype("cuda")) for t in (q, k, v))
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and _varlen_attn() is not None:
        out = _flash_varlen(q, k, v, cu_seqlens, max_seqlen, scaling)
    else:
        out = _per_sequence_sdpa(q, k, v, cu_seqlens, scaling)
    return out[None]


def _per_sequence_sdpa(q, k, v, cu_seqlens, scaling):
    """Causal SDPA on each sequence of the packed row in turn: memory and work grow with the square of
    each sequence's length, not of the row's (a block-diagonal mask over the row would hold ``T x T``
    entries per head and layer, gigabytes for a micro-batch of a few thousand tokens)."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    bounds = cu_seqlens.tolist()
    outs = [
        F.scaled_dot_product_attention(
            q[a:b].transpose(0, 1),
            k[a:b].transpose(0, 1),
            v[a:b].transpose(0, 1),
            is_causal=True,
            scale=scaling,
        ).transpose(0, 1)
        for a, b in itertools.pairwise(bounds)
    ]
    return torch.cat(outs)


def _flash_varlen(q, k, v, cu_seqlens, max_seqlen, scaling):
    fn = _varlen_attn()
    params = _varlen_params()
    kwargs: dict = {"scale": scaling}
    if "is_causal" in params:
        kwargs["is_causal"] = True
    else:
        kwargs["window_size"] = (-1, 0)
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    return fn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)


@functools.cache
def _varlen_params() -> frozenset[str]:
    """The keyword names this torch's ``varlen_attn`` takes (``is_causal`` and ``enable_gqa`` came later)."""
    return frozenset(inspect.signature(_varlen_attn()).parameters)


@functools.cache
def _varlen_attn():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn
