"""The fused log-prob/entropy kernels against the eager fp32 path: values and gradients.

Runs on CUDA with Triton, or on CPU with Triton installed and ``TRITON_INTERPRET=1`` (the kernels
interpreted); skipped otherwise, with the reason.
"""

from __future__ import annotations

import os

import pytest
import torch

from verl.utils import fused_log_probs
from verl.workers.forward import EntropyOptions, response_log_probs, scaled_logits

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [] if INTERPRETED else pytest.mark.gpu
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _needs_kernels():
    if not fused_log_probs.available(torch.empty(0, device=DEVICE)):
        pytest.skip("needs CUDA and Triton (or Triton with TRITON_INTERPRET=1)")


def _eager(head: torch.Tensor, labels: torch.Tensor, temperature: float):
    log_softmax = torch.log_softmax(scaled_logits(head, temperature), -1)
    return log_softmax.gather(-1, labels[..., None])[..., 0], -(log_softmax.exp() * log_softmax).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_entropy_and_their_gradients_equal_the_eager_path(dtype, temperature):
    g = torch.Generator().manual_seed(0)
    vocab = 5000 if INTERPRETED else 151_936  # several BLOCKs, the last one partly outside the vocabulary
    logits = (torch.randn(3, 7, vocab, generator=g) * 4).to(dtype).to(DEVICE)
    labels = torch.randint(0, vocab, (3, 6), generator=g).to(DEVICE)
    weights = torch.randn(2, 3, 6, generator=g).to(DEVICE)
    grads, outs = [], []
    for fn in (fused_log_probs.log_probs_and_entropy, _eager):
        leaf = logits.clone().requires_grad_(True)
        head = leaf[:, :-1]  # as the padded path slices it: rows not evenly spaced in memory
        log_probs, entropy = fn(head, labels, temperature)
        (log_probs * weights[0] + entropy * weights[1]).sum().backward()
        outs.append((log_probs, entropy))
        grads.append(leaf.grad)
    (lp, ent), (lp_ref, ent_ref) = outs
    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=2e-5)
    # bf16: the eager path rounds its fp32 gradient once too, after a different order of sums
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-5}
    torch.testing.assert_close(grads[0], grads[1], **tol)
    assert grads[0][:, -1].abs().max() == 0  # the row outside the view gets no gradient


def test_the_log_probs_alone_give_the_log_softmax_gradient():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 300, generator=g).to(DEVICE).requires_grad_(True)
    labels = torch.randint(0, 300, (5,), generator=g).to(DEVICE)
    log_probs, _ = fused_log_probs.log_probs_and_entropy(logits, labels, 1.0)
    log_probs.sum().backward()
    expected = torch.nn.functional.one_hot(labels, 300).float() - torch.softmax(logits.detach(), -1)
    torch.testing.assert_close(logits.grad, expected, rtol=1e-5, atol=1e-6)


def test_mismatched_labels_are_an_error_naming_both_shapes():
    with pytest.raises(ValueError, match=r"head \(2, 3, 10\) and labels \(2, 4\)"):
        fused_log_probs.log_probs_and_entropy(
            torch.zeros(2, 3, 10, device=DEVICE), torch.zeros(2, 4).long(), 1.0
        )


def test_response_log_probs_of_a_model_equal_the_eager_path(builtin_assets, monkeypatch):
    """Log-probs, trained entropy and the model's gradients through the whole forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(builtin_assets["model"], dtype=torch.float32).to(DEVICE)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 15, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded prompt
    micro = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, 6:],
    }
    micro = {k: v.to(DEVICE) for k, v in micro.items()}
    results = []
    for fused in (True, False):
        monkeypatch.setattr(fused_log_probs, "FUSED_LOG_PROBS", fused)
        model.zero_grad(set_to_none=True)
        out = response_log_probs(model, micro, 0.9, EntropyOptions())
        (out["log_probs"].sum() - 0.1 * out["entropys"].sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results.append((out["log_probs"].detach(), out["entropys"].detach(), grads))
    (lp, ent, grads), (lp_ref, ent_ref, grads_ref) = results
    torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("packed", [False, True])
def test_sft_token_losses_equal_torchs_cross_entropy(monkeypatch, packed):
    """The SFT trainer's per-token cross-entropy (padded and packed rows) and the model's gradients."""
    from transformers import Qwen2ForCausalLM

    from tests.workers.test_packing import _config
    from verl.trainer.sft_trainer import packed_token_losses, token_losses
    from verl.workers.packing import enable_packing

    torch.manual_seed(0)
    model = enable_packing(Qwen2ForCausalLM(_config())).to(DEVICE).train()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 300, (4, 10), generator=g)
    mask = (torch.arange(10) < torch.tensor([[10], [6], [8], [2]])).long()  # right-padded chats
    micro = {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "position_ids": torch.arange(10) * mask,
        "loss_mask": mask * (torch.rand(mask.shape, generator=g) < 0.6).long(),  # assistant tokens
    }
    micro = {k: v.to(DEVICE) for k, v in micro.items()}
    kernel, calls = fused_log_probs.log_probs_and_entropy, []
    monkeypatch.setattr(fused_log_probs, "log_probs_and_entropy", lambda *a: calls.append(1) or kernel(*a))
    results = []
    for fused in (True, False):
        monkeypatch.setattr(fused_log_probs, "FUSED_LOG_PROBS", fused)
        model.zero_grad(set_to_none=True)
        losses, mask = (packed_token_losses if packed else token_losses)(model, micro)
        (losses * mask).sum().backward()
        results.append((losses.detach(), [p.grad.clone() for p in model.parameters()]))
    (losses, grads), (losses_ref, grads_ref) = results
    assert len(calls) == 1  # the fused pass ran the kernel, the other did not
    assert losses.dtype == torch.float32 and losses.shape == losses_ref.shape
    assert losses.min() > 0  # a cross-entropy, not a log-prob
    torch.testing.assert_close(losses, losses_ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
