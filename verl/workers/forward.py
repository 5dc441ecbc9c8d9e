"""Forward functions shared by the trainer and the rollout engine.

The rollout recomputes the log-probs of the tokens it sampled with the same function the
actor uses, so on CPU in fp32 the two agree bit for bit (same weights, same shapes).

Layout: ``input_ids`` is ``[prompt (left-padded, P) | response (right-padded, R)]``; the
logits that predict response token ``t`` sit at position ``P - 1 + t``.
"""

from __future__ import annotations

import torch
from torch import nn

from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

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


def response_logits(module: nn.Module, micro: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Logits ``[b, R, V]`` (fp32, divided by ``temperature``) that predict each response token."""
    response_length = micro["responses"].shape[1]
    out = module(
        input_ids=micro["input_ids"],
        attention_mask=micro["attention_mask"],
        position_ids=micro["position_ids"],
        use_cache=False,
    )
    logits = out.logits[:, -response_length - 1 : -1].float()
    return logits / temperature if temperature not in (0, 1) else logits


def response_log_probs(
    module: nn.Module, micro: dict[str, torch.Tensor], temperature: float, with_entropy: bool = False
) -> dict[str, torch.Tensor]:
    """``log_probs`` ``[b, R]`` of the response tokens, and ``entropys`` when asked."""
    logits = response_logits(module, micro, temperature)
    out = {"log_probs": logprobs_from_logits(logits, micro["responses"])}
    if with_entropy:
        out["entropys"] = entropy_from_logits(logits)
    return out


def response_values(module: nn.Module, micro: dict[str, torch.Tensor]) -> torch.Tensor:
    """Critic values ``[b, R]``: the value head's output at the state before each response token."""
    response_length = micro["responses"].shape[1]
    out = module(
        input_ids=micro["input_ids"],
        attention_mask=micro["attention_mask"],
        position_ids=micro["position_ids"],
        use_cache=False,
    )
    return out.logits[:, -response_length - 1 : -1, 0].float()
