"""Sampling parameters and one sampling step (temperature, top-k, top-p, greedy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from verl.config.rollout import RolloutConfig

SEED_STRIDE = 1_000_003
"""A prime larger than any batch: the seeds of two streams never collide within a batch."""


def derived_seed(stream: int, offset: int) -> int:
    """The seed of item ``offset`` of seed stream ``stream``: ``stream * SEED_STRIDE + offset``.

    The one rule every backend seeds its sampling with: a batch's ``meta_info["sampling_seed"]`` is
    the stream and the rollout's own seed (or a row's index in the batch) the offset; a server
    seeds its n-th unseeded request with its own seed as the stream."""
    return int(stream) * SEED_STRIDE + int(offset)


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    response_length: int
    ignore_eos: bool
    validate: bool

    @classmethod
    def resolve(cls, config: RolloutConfig, meta_info: dict[str, Any]) -> SamplingParams:
        """The config's training parameters, or ``val_kwargs`` when ``meta_info["validate"]``;
        explicit ``meta_info`` entries win over both."""
        validate = bool(meta_info.get("validate", False))
        source = config.val_kwargs if validate else config
        params = {
            "do_sample": source.do_sample,
            "temperature": source.temperature,
            "top_k": source.top_k,
            "top_p": source.top_p,
        }
        params.update({k: meta_info[k] for k in params if k in meta_info})
        if params["temperature"] == 0:
            params["do_sample"] = False
        return cls(
            **params,
            response_length=int(meta_info.get("response_length", config.response_length)),
            ignore_eos=config.ignore_eos,
            validate=validate,
        )


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf; always keeps the best token."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative - sorted_logits.softmax(-1) >= top_p  # mass before this token already >= p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens ``[B]`` and their log-probs under ``softmax(logits / temperature)``.

    Greedy decoding reports log-probs at temperature 1. Top-k/top-p only restrict which
    tokens can be drawn; the reported log-prob is that of the tempered, unfiltered
    distribution (the distribution the trainer recomputes, as in verl).
    """
    if not params.do_sample:
        tokens = logits.argmax(dim=-1)
        return tokens, F.log_softmax(logits, dim=-1).gather(-1, tokens[:, None])[:, 0]
    scaled = logits / params.temperature
    filtered = filter_logits(scaled, params.top_k, params.top_p)
    probs = filtered.softmax(dim=-1)
    tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return tokens, F.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None])[:, 0]


def sample_with_uniforms(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """As :func:`sample_tokens`, with row ``i`` drawn by inverting its CDF at ``uniforms[i]``
    (in [0, 1)). A row's token then depends on its own logits and number only, not on which
    other rows share the batch (the server batches whatever requests are running)."""
    if not params.do_sample:
        return sample_tokens(logits, params, None)
    scaled = logits / params.temperature
    probs = filter_logits(scaled, params.top_k, params.top_p).softmax(dim=-1)
    cdf = probs.cumsum(dim=-1)
    target = (uniforms.to(cdf.device, cdf.dtype) * cdf[:, -1])[:, None]
    tokens = torch.searchsorted(cdf, target, right=True)[:, 0].clamp(max=logits.shape[-1] - 1)
    # a token of zero probability is never drawn, even where the CDF is flat at the target
    tokens = torch.where(probs.gather(-1, tokens[:, None])[:, 0] > 0, tokens, probs.argmax(-1))
    return tokens, F.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None])[:, 0]
