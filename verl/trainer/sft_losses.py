"""The SFT loss per token: the cross-entropy of each trained token given the ones before it, from
a right-padded micro-batch (:func:`token_losses`) or the same micro-batch packed into one row
(:func:`packed_token_losses`, ``model.use_remove_padding``). A vision-language model's micro-batch
carries ``[B, 3, L]`` M-RoPE positions and its image inputs, which both forwards pass on. Under the
Megatron engine's tensor parallelism the padded forward's logits are a slice of the vocabulary
(the module's ``vocab_parallel_group``), and the cross-entropy is the vocab-parallel one."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl.utils import fused_log_probs
from verl.utils.mrope import model_position_ids
from verl.workers import ulysses
from verl.workers.packing import outputs_at, pack
from verl.workers.vision import vision_kwargs

__all__ = ["packed_token_losses", "token_cross_entropy", "token_losses"]


def token_losses(
    module: torch.nn.Module, micro: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cross-entropy of predicting each token from the ones before it, and the mask of
    tokens trained on (``loss_mask`` shifted onto the predicting position)."""
    width = int(micro["attention_mask"].sum(-1).max())  # right-padded: drop columns of pads only
    ids, mask = micro["input_ids"][:, :width], micro["attention_mask"][:, :width]
    positions = model_position_ids(micro["position_ids"][..., :width])  # [B, L], or [3, B, L] (M-RoPE)
    logits = module(input_ids=ids, attention_mask=mask, position_ids=positions, **vision_kwargs(micro)).logits
    group = getattr(module, "vocab_parallel_group", None)  # Megatron's tensor parallelism: a vocabulary slice
    if group is not None:
        losses = _vocab_parallel_cross_entropy(logits[:, :-1], ids[:, 1:], group)
    else:
        losses = token_cross_entropy(logits[:, :-1], ids[:, 1:])
    return losses, micro["loss_mask"][:, 1:width].to(losses.dtype)


def _vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, group) -> torch.Tensor:
    """:func:`token_cross_entropy` from this rank's slice of the vocabulary's logits (the Megatron
    engine under tensor parallelism), without gathering the vocabulary."""
    from verl.workers.engine.megatron import vocab_parallel

    return -vocab_parallel.log_probs_and_entropy(logits.float(), labels, group, entropy=False)[0]


def packed_token_losses(
    module: torch.nn.Module, micro: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_losses` with the micro-batch packed into one row (``model.use_remove_padding``):
    the LM head runs only where a trained token is predicted. The 1-D losses of those tokens (of
    this rank's slice of the row under sequence parallelism) and a mask of ones."""
    packed = pack(micro)
    trained = (micro["loss_mask"][:, 1:] * micro["attention_mask"][:, 1:]).bool()
    index = packed.packed_at[:, :-1][trained]  # the position predicting each trained token
    labels = micro["input_ids"][:, 1:][trained]
    if ulysses.active():
        logits, mine = ulysses.local_outputs_at(module, packed, index, causal_lm=True)
        labels = labels[mine]
    else:
        logits = outputs_at(module, packed, index, causal_lm=True)
    losses = token_cross_entropy(logits, labels)
    return losses, torch.ones_like(losses)


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """fp32 cross-entropy of each label under ``logits`` (``[..., V]``), shaped like ``labels``. On
    CUDA the fused log-prob kernel (:mod:`verl.utils.fused_log_probs`: one pass over the logits, no
    fp32 copy of them; equal within fp32 rounding), elsewhere torch's cross-entropy on fp32 logits."""
    if fused_log_probs.available(logits):
        return -fused_log_probs.log_probs_and_entropy(logits, labels, 1.0)[0]
    flat = logits.float().reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat, labels.reshape(-1), reduction="none").view(labels.shape)
