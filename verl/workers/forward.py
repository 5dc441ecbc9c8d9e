"""Forward functions shared by the trainer and the rollout engine.

The rollout recomputes the log-probs of the tokens it sampled with the same function the
actor uses, so on CPU in fp32 the two agree to rounding (same weights, same shapes): within 1e-5,
bit for bit on some CPUs.

Layout: ``input_ids`` is ``[prompt (left-padded, P) | response (right-padded, R)]``; the
logits that predict response token ``t`` sit at position ``P - 1 + t``. With ``packed`` the same
micro-batch runs without its pads (:mod:`verl.workers.packing`) and gives the same outputs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache, partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from verl.utils import fused_log_probs
from verl.utils.mrope import model_position_ids
from verl.utils.torch_functional import entropy_from_logits, entropy_from_logits_chunked, logprobs_from_logits
from verl.workers.packing import packed_response_outputs
from verl.workers.vision import vision_kwargs

POLICY_INPUT_KEYS = ["input_ids", "attention_mask", "position_ids", "responses"]


def whole_sequence_batch(token_ids: list[int]) -> dict[str, torch.Tensor]:
    """One unpadded sequence as a batch of one whose "response" is every token after the first:
    the log-probs of ``token_ids[1:]`` (the weight-sync probe scores sequences this way)."""
    ids = torch.tensor([token_ids])
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(len(token_ids))[None],
        "responses": ids[:, 1:],
    }


LOG_PROB_CHUNK_BYTES = 16 << 20
"""fp32 logits of this many bytes at most are alive at once while log-probs are computed. Kept under
glibc's 32 MB ceiling for heap allocations: larger blocks are mapped fresh from the kernel and
handed back on free, so each chunk's tensors would fault in new pages every time (64 MB chunks
cost a SmolLM2 update about 1M page faults and 1 s on 2 cores; 16 MB, a tenth of those)."""


def scaled_logits(head: torch.Tensor, temperature: float) -> torch.Tensor:
    """The LM head's outputs in fp32, divided by ``temperature``: the distribution sampled from."""
    logits = head.float()
    return logits / temperature if temperature not in (0, 1) else logits


def _token_log_probs(head: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    return logprobs_from_logits(scaled_logits(head, temperature), labels)


def _chunk_rows(head: torch.Tensor) -> int:
    """Rows of the head's outputs whose fp32 logits take at most ``LOG_PROB_CHUNK_BYTES``."""
    return max(1, LOG_PROB_CHUNK_BYTES * len(head) // max(1, 4 * head.numel()))


def _by_row_chunks(fn, head: torch.Tensor, per_row: torch.Tensor, temperature: float) -> torch.Tensor:
    """``fn(head rows, per_row rows, temperature)`` a few rows at a time: the fp32 logits of one chunk
    exist at once, in forward and, recomputed, in backward (the head's outputs are all autograd
    keeps). Rows are independent, so values and gradients are those of the whole batch, bit for bit."""
    rows = _chunk_rows(head)
    chunks = zip(head.split(rows), per_row.split(rows))
    if not (torch.is_grad_enabled() and head.requires_grad):
        return torch.cat([fn(h, r, temperature) for h, r in chunks])
    return torch.cat(
        [checkpoint(fn, h, r, temperature, use_reentrant=False, preserve_rng_state=False) for h, r in chunks]
    )


def response_token_log_probs(head: torch.Tensor, responses: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs ``[b, R]`` of the response tokens from the head's outputs ``[b, R, V]``."""
    return _by_row_chunks(_token_log_probs, head, responses, temperature)


def _gathered_log_probs(head: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.log_softmax(scaled_logits(head, temperature), dim=-1).gather(-1, ids)


def response_gathered_log_probs(head: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs ``[b, R, K]`` of the tokens ``ids`` ``[b, R, K]`` at each response position (the
    student's at a teacher's top-k tokens)."""
    return _by_row_chunks(_gathered_log_probs, head, ids, temperature)


def response_topk(head: torch.Tensor, k: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens at each response position: log-probs and ids, ``[b, R, k]`` each
    (a teacher's, for forward_kl_topk; outside autograd)."""
    with torch.no_grad():
        tops = [
            torch.log_softmax(scaled_logits(h, temperature), dim=-1).topk(k, dim=-1)
            for h in head.split(_chunk_rows(head))
        ]
    return torch.cat([t.values for t in tops]), torch.cat([t.indices for t in tops])


def _response_outputs(
    module: nn.Module, micro: dict[str, torch.Tensor], packed: bool, causal_lm: bool
) -> torch.Tensor:
    """The head's outputs ``[b, R, C]`` at the positions that predict each response token."""
    if packed:
        return packed_response_outputs(module, micro, causal_lm)
    response_length = micro["responses"].shape[1]
    ids, mask, pos = drop_common_left_padding(
        micro["input_ids"], micro["attention_mask"], micro["position_ids"]
    )
    inputs = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": model_position_ids(pos),
        "use_cache": False,
    }
    inputs.update(vision_kwargs(micro))
    if causal_lm and takes_logits_to_keep(module):  # the LM head runs on the response's positions only
        return module(**inputs, logits_to_keep=response_length + 1).logits[:, :-1]
    return module(**inputs).logits[:, -response_length - 1 : -1]


def takes_logits_to_keep(module: nn.Module) -> bool:
    """Whether the causal LM's forward takes ``logits_to_keep`` (transformers' models do, some remote code not)."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module  # peft
    return _forward_takes(type(base), "logits_to_keep")


@cache
def _forward_takes(cls: type, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters


def drop_common_left_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three without the leading columns that are padding in every row. Prompts are left-padded to ``data.max_prompt_length``; a batch whose longest
    prompt is shorter need not run the model over the columns no row uses (the outputs of real tokens
    are the same: pads are masked out of attention, and positions count real tokens only)."""
    start = int(attention_mask.any(0).to(torch.int8).argmax())  # the first column some row uses
    return input_ids[:, start:], attention_mask[:, start:], position_ids[..., start:]  # [B, L] or [B, 3, L]


@dataclass(frozen=True)
class EntropyOptions:
    """How the entropy is computed (``actor.entropy_from_logits_with_chunking``, ``entropy_checkpointing``)."""

    chunk_size: int | None = None
    """Positions per chunk; None computes every position at once."""
    checkpointing: bool = False
    """Recompute the softmax in backward instead of keeping it for the gradient."""
    metric_only: bool = False
    """The entropy is reported, not trained on (``entropy_coeff=0``): computed outside autograd, so
    none of its full-vocabulary intermediates is kept for a backward that never reaches them."""


def response_entropy(logits: torch.Tensor, options: EntropyOptions) -> torch.Tensor:
    """Entropy ``[b, R]`` of each position's distribution; the options change memory, not values."""
    fn = entropy_from_logits
    if options.chunk_size is not None:
        fn = partial(entropy_from_logits_chunked, chunk_size=options.chunk_size)
    if options.metric_only:
        with torch.no_grad():
            return fn(logits)
    if options.checkpointing and torch.is_grad_enabled() and logits.requires_grad:
        return checkpoint(fn, logits, use_reentrant=False)
    return fn(logits)


def response_log_probs(
    module: nn.Module,
    micro: dict[str, torch.Tensor],
    temperature: float,
    entropy: EntropyOptions | None = None,
    sum_pi_squared: bool = False,
    packed: bool = False,
    topk: int | None = None,
) -> dict[str, torch.Tensor]:
    """``log_probs`` ``[b, R]`` of the response tokens; ``entropys`` when ``entropy`` is given;
    ``sum_pi_squared`` (``sum_v pi(v)^2`` of each position's distribution, what the optimal token
    baseline weighs paths by) when asked; ``packed`` runs the micro-batch without pads. Distillation:
    ``topk`` adds the ``topk_log_probs`` and ``topk_ids`` of each position's k most likely tokens (a
    teacher's), and ``teacher_topk_ids`` in the micro-batch adds ``student_topk_log_probs``, the
    log-probs of those tokens (a student's, with gradient). On CUDA the
    log-probs and entropy come from one fused Triton pass (:mod:`verl.utils.fused_log_probs`; equal
    within fp32 rounding), elsewhere from torch ops a few rows at a time."""
    head = _response_outputs(module, micro, packed, causal_lm=True)
    trained = torch.is_grad_enabled() and head.requires_grad
    group = getattr(module, "vocab_parallel_group", None)
    if group is not None:  # Megatron under tensor parallelism: this rank's slice of the vocabulary
        return _vocab_parallel_outputs(head, micro["responses"], temperature, group, entropy, sum_pi_squared)
    if fused_log_probs.available(head):  # CUDA: one Triton pass gives both, no fp32 copy of the head
        log_probs, entropys = fused_log_probs.log_probs_and_entropy(head, micro["responses"], temperature)
        out = {"log_probs": log_probs}
        if entropy is not None:
            out["entropys"] = entropys if trained and not entropy.metric_only else entropys.detach()
    else:
        out = {"log_probs": response_token_log_probs(head, micro["responses"], temperature)}
        if entropy is not None and trained and not entropy.metric_only:  # the loss takes its gradient
            out["entropys"] = response_entropy(scaled_logits(head, temperature), entropy)
        elif entropy is not None:
            out["entropys"] = _untrained(partial(response_entropy, options=entropy), head, temperature)
    if sum_pi_squared:
        out["sum_pi_squared"] = _untrained(_sum_pi_squared, head, temperature)
    if topk is not None:
        out["topk_log_probs"], out["topk_ids"] = response_topk(head, topk, temperature)
    if "teacher_topk_ids" in micro:
        ids = micro["teacher_topk_ids"].long()
        out["student_topk_log_probs"] = response_gathered_log_probs(head, ids, temperature)
    return out


def _vocab_parallel_outputs(
    head: torch.Tensor,
    responses: torch.Tensor,
    temperature: float,
    group,
    entropy: EntropyOptions | None,
    sum_pi_squared: bool,
) -> dict[str, torch.Tensor]:
    """:func:`response_log_probs` from vocab-parallel logits (:mod:`verl.workers.engine.megatron.vocab_parallel`):
    the same values, no rank holding the whole vocabulary."""
    from verl.workers.engine.megatron import vocab_parallel

    logits = scaled_logits(head, temperature)
    log_probs, entropys = vocab_parallel.log_probs_and_entropy(logits, responses, group, entropy is not None)
    out = {"log_probs": log_probs}
    if entropy is not None:
        trained = torch.is_grad_enabled() and head.requires_grad and not entropy.metric_only
        out["entropys"] = entropys if trained else entropys.detach()
    if sum_pi_squared:
        out["sum_pi_squared"] = vocab_parallel.sum_pi_squared(logits, group)
    return out


def _sum_pi_squared(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, dim=-1).square().sum(-1)


def _untrained(fn, head: torch.Tensor, temperature: float) -> torch.Tensor:
    """``fn`` of the fp32 scaled logits ``[b, R]``, outside autograd and a few rows at a time (as
    :func:`response_token_log_probs`): same values, one chunk's fp32 logits alive at once."""
    with torch.no_grad():
        return torch.cat([fn(scaled_logits(h, temperature)) for h in head.split(_chunk_rows(head))])


def response_values(module: nn.Module, micro: dict[str, torch.Tensor], packed: bool = False) -> torch.Tensor:
    """Critic values ``[b, R]``: the value head's output at the state before each response token."""
    return _response_outputs(module, micro, packed, causal_lm=False)[..., 0].float()
