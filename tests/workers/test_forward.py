"""The padded log-prob forward runs the LM head on the response's positions only and gives what the
head on every position gives; a model whose forward has no ``logits_to_keep`` still works."""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen2ForCausalLM

from tests.workers.test_packing import _config
from verl.workers.forward import EntropyOptions, response_log_probs, takes_logits_to_keep

PROMPT, RESPONSE = 9, 5


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(_config()).train()


def _micro() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (4, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left pads
    mask[2, -2:] = 0  # right pads
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, PROMPT:],
    }


class NoLogitsToKeep(nn.Module):
    """A causal LM whose forward takes no ``logits_to_keep`` (as some remote-code models)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, position_ids, use_cache=False):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        )


def _every_position(model, micro) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies from the logits of every position (the reference)."""
    logits = model(
        input_ids=micro["input_ids"],
        attention_mask=micro["attention_mask"],
        position_ids=micro["position_ids"],
    ).logits[:, PROMPT - 1 : -1]
    log_softmax = logits.float().log_softmax(-1)
    log_probs = log_softmax.gather(-1, micro["responses"][..., None])[..., 0]
    return log_probs, -(log_softmax.exp() * log_softmax).sum(-1)


def _gradients(model) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def test_the_head_sees_the_response_positions_only_and_the_outputs_equal_the_full_head():
    model, micro = _model(), _micro()
    seen = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))

    out = response_log_probs(model, micro, 1.0, EntropyOptions())
    (out["log_probs"].sum() + 0.1 * out["entropys"].sum()).backward()
    ours = _gradients(model)
    log_probs, entropys = _every_position(model, micro)
    (log_probs.sum() + 0.1 * entropys.sum()).backward()
    reference = _gradients(model)

    assert seen == [RESPONSE + 1, PROMPT + RESPONSE]  # ours, then the reference's full head
    torch.testing.assert_close(out["log_probs"], log_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(out["entropys"], entropys, rtol=1e-6, atol=1e-6)  # another formula: rounding
    for name, grad in reference.items():  # float rounding only: sums over fewer positions
        assert float((ours[name] - grad).abs().max()) <= 1e-6 * float(grad.abs().max()), name


def test_a_forward_without_logits_to_keep_runs_the_head_on_every_position():
    inner, micro = _model(), _micro()
    wrapped = NoLogitsToKeep(inner)
    assert takes_logits_to_keep(inner) and not takes_logits_to_keep(wrapped)
    seen = []
    inner.lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    with torch.no_grad():
        out = response_log_probs(wrapped, micro, 1.0)
        expected, _ = _every_position(inner, micro)
    assert seen == [PROMPT + RESPONSE, PROMPT + RESPONSE]
    torch.testing.assert_close(out["log_probs"], expected, rtol=0, atol=1e-6)


def test_columns_no_row_uses_are_not_run():
    model, micro = _model(), _micro()
    micro["attention_mask"][:, :3] = 0  # every prompt has at least 3 left pads
    micro["position_ids"] = (micro["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    widths = []
    model.model.embed_tokens.register_forward_hook(lambda module, args, out: widths.append(args[0].shape[1]))
    with torch.no_grad():
        out = response_log_probs(model, micro, 1.0)
        expected, _ = _every_position(model, micro)
    assert widths == [PROMPT + RESPONSE - 3, PROMPT + RESPONSE]  # ours, then the reference's
    torch.testing.assert_close(out["log_probs"], expected, rtol=0, atol=1e-6)
