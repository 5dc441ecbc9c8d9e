"""The distillation loss (verl.algorithms.distillation) against direct computations: the k3 estimator
from two real models' log-probs, the top-k forward KL from their full distributions, the
policy-gradient form at ratio 1, and the sum with the task's loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from verl.algorithms.actor_loss import compute_actor_loss
from verl.algorithms.distillation import compute_distilled_actor_loss
from verl.config.actor import ActorConfig
from verl.config.distillation import DistillationLossConfig
from verl.workers.forward import response_log_probs

K = 4
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def pair(builtin_assets):
    """The built-in student and a second model of the same tokenizer (the student, perturbed)."""
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(builtin_assets["model"]).eval()
    teacher = AutoModelForCausalLM.from_pretrained(builtin_assets["model"]).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in teacher.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator))
    return student, teacher


def micro_batch() -> dict[str, torch.Tensor]:
    """Two rows: prompt (left-padded to 4) | response (right-padded to 3)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 15, (2, 7), generator=generator)
    attention = torch.ones_like(ids)
    attention[1, 0] = 0  # one prompt pad
    attention[0, 6] = 0  # one response pad
    position = (attention.cumsum(-1) - 1).clamp_min(0)
    response_mask = attention[:, 4:].float()
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": position,
        "responses": ids[:, 4:],
        "response_mask": response_mask,
    }


def direct_log_softmax(model, micro: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """``[B, R, V]`` log-softmax at the positions predicting each response token, by a plain forward."""
    with torch.no_grad():
        logits = model(
            input_ids=micro["input_ids"],
            attention_mask=micro["attention_mask"],
            position_ids=micro["position_ids"],
        ).logits.float()
    return F.log_softmax(logits[:, 3:-1] / temperature, dim=-1)


def actor_config(**changes) -> ActorConfig:
    config = ActorConfig(loss_agg_mode="token-mean")
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum())


def test_k3_equals_the_estimator_on_both_models_log_probs(pair):
    student, teacher = pair
    micro = micro_batch()
    responses = micro["responses"]
    s_lp = direct_log_softmax(student, micro, TEMPERATURE).gather(-1, responses[..., None])[..., 0]
    t_lp = direct_log_softmax(teacher, micro, 1.0).gather(-1, responses[..., None])[..., 0]
    delta = (t_lp - s_lp).clamp(-20, 20)  # verl's k3: the log-ratio and the value clamped
    expected = masked_token_mean((delta.exp() - delta - 1).clamp(max=10), micro["response_mask"])

    out = response_log_probs(student, micro, TEMPERATURE)
    teacher_out = response_log_probs(teacher, micro, 1.0)
    micro["teacher_log_probs"] = teacher_out["log_probs"]
    loss, metrics = compute_distilled_actor_loss(
        out, micro, actor_config(), DistillationLossConfig(loss_mode="k3", use_task_rewards=False)
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["distillation/loss"] == pytest.approx(expected, abs=1e-6)
    loss.backward()  # a supervised loss: the student's weights get a gradient from it
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    student.zero_grad(set_to_none=True)


def test_forward_kl_topk_equals_the_divergence_over_the_teachers_top_k(pair):
    student, teacher = pair
    micro = micro_batch()
    t_full = direct_log_softmax(teacher, micro, 1.0)
    s_full = direct_log_softmax(student, micro, TEMPERATURE)
    t_top, ids = t_full.topk(K, dim=-1)
    s_top = s_full.gather(-1, ids)
    per_token = (t_top.exp() * (t_top - s_top)).sum(-1).clamp_min(0)
    expected = masked_token_mean(per_token, micro["response_mask"])

    scored = response_log_probs(teacher, micro, 1.0, topk=K)
    assert torch.equal(scored["topk_ids"], ids)
    micro.update(teacher_topk_log_probs=scored["topk_log_probs"], teacher_topk_ids=scored["topk_ids"])
    with torch.no_grad():
        out = response_log_probs(student, micro, TEMPERATURE)
    config = DistillationLossConfig(loss_mode="forward_kl_topk", topk=K, use_task_rewards=False)
    loss, metrics = compute_distilled_actor_loss(out, micro, actor_config(), config)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    mass = masked_token_mean(t_top.exp().sum(-1), micro["response_mask"])
    assert metrics["distillation/teacher_mass"] == pytest.approx(mass, abs=1e-6)
    assert 0 < metrics["distillation/student_mass"] <= 1


def per_token_k3(micro: dict[str, torch.Tensor], log_prob: torch.Tensor) -> torch.Tensor:
    delta = micro["teacher_log_probs"] - log_prob.detach()
    return delta.exp() - delta - 1


def synthetic_micro() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    log_prob = -torch.rand(3, 5, generator=generator) * 3
    micro = {
        "response_mask": (torch.rand(3, 5, generator=generator) > 0.2).float(),
        "teacher_log_probs": -torch.rand(3, 5, generator=generator) * 3,
        "old_log_probs": log_prob.clone(),
        "advantages": torch.randn(3, 5, generator=generator),
    }
    return micro, log_prob.requires_grad_()


def test_as_a_policy_gradient_the_advantage_is_the_negative_loss():
    micro, log_prob = synthetic_micro()
    config = DistillationLossConfig(loss_mode="k1", use_policy_gradient=True, use_task_rewards=False)
    loss, metrics = compute_distilled_actor_loss({"log_probs": log_prob}, micro, actor_config(), config)
    k1 = (log_prob - micro["teacher_log_probs"]).detach()
    # ratio 1 at the old policy: the clipped loss is -A = k1, its gradient k1 * d log_prob / token count
    assert loss.item() == pytest.approx(masked_token_mean(k1, micro["response_mask"]), abs=1e-6)
    loss.backward()
    expected_grad = k1 * micro["response_mask"] / micro["response_mask"].sum()
    assert torch.allclose(log_prob.grad, expected_grad, atol=1e-6)
    assert "distillation/pg_clipfrac" in metrics and "actor/pg_loss" in metrics  # task metrics, as verl


def test_with_task_rewards_the_losses_add_with_the_coefficient():
    micro, log_prob = synthetic_micro()
    config = DistillationLossConfig(loss_mode="k3", use_task_rewards=True, distillation_loss_coef=0.5)
    actor = actor_config()
    loss, metrics = compute_distilled_actor_loss({"log_probs": log_prob}, micro, actor, config)
    task, _ = compute_actor_loss(log_prob, None, micro, actor)
    distill = masked_token_mean(per_token_k3(micro, log_prob), micro["response_mask"])
    assert metrics["distillation/loss"] == pytest.approx(distill, abs=1e-6)
    assert loss.item() == pytest.approx(task.item() + 0.5 * distill, abs=1e-6)


def test_the_loss_max_clamp_bounds_each_token():
    micro, log_prob = synthetic_micro()
    micro["teacher_log_probs"][0, 0] = 5.0  # a huge k3 at one token
    config = DistillationLossConfig(loss_mode="k3", use_task_rewards=False, loss_max_clamp=0.5)
    loss, _ = compute_distilled_actor_loss({"log_probs": log_prob}, micro, actor_config(), config)
    clamped = per_token_k3(micro, log_prob).clamp(max=0.5)
    assert loss.item() == pytest.approx(masked_token_mean(clamped, micro["response_mask"]), abs=1e-6)
