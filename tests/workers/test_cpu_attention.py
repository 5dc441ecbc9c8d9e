"""The attention implementation models load with: ``override_config.attn_implementation`` takes
effect (for the policy and the critic), and on CPU under bf16 autocast the engines' default is
:mod:`verl.workers.cpu_attention`: the model's eager attention (as accurate there as SDPA) while a
call's scores are small, SDPA beyond."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from verl.builtin.task import build_char_tokenizer, build_tiny_qwen2
from verl.config.actor import ModelConfig
from verl.config.critic import CriticModelConfig
from verl.config.engine import FSDPConfig
from verl.utils.model import load_causal_lm, load_value_model
from verl.workers import cpu_attention
from verl.workers.cpu_attention import default_attention
from verl.workers.forward import response_log_probs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = build_char_tokenizer()
    build_tiny_qwen2(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _fsdp(cpu_autocast: bool, param_dtype: str = "bf16") -> FSDPConfig:
    fsdp = FSDPConfig()
    fsdp.mixed_precision.cpu_autocast = cpu_autocast
    fsdp.mixed_precision.param_dtype = param_dtype
    return fsdp


def test_override_config_attn_implementation_takes_effect(model_dir):
    assert load_causal_lm(ModelConfig(path=model_dir)).config._attn_implementation == "sdpa"
    eager = ModelConfig(path=model_dir, override_config={"attn_implementation": "eager"})
    assert load_causal_lm(eager).config._attn_implementation == "eager"
    critic = CriticModelConfig(
        path=model_dir, override_config={"attn_implementation": "eager"}, external_lib=None, gguf_file=None
    )
    assert load_value_model(critic).config._attn_implementation == "eager"
    # the override wins over the engine's default
    sdpa = ModelConfig(path=model_dir, override_config={"attn_implementation": "sdpa"})
    assert load_causal_lm(sdpa, attention="eager").config._attn_implementation == "sdpa"
    key = r"actor_rollout_ref\.model\.override_config\.attn_implementation="
    with pytest.raises(ValueError, match=key + "'no_such_attention'"):
        load_causal_lm(
            ModelConfig(path=model_dir, override_config={"attn_implementation": "no_such_attention"})
        )
    if importlib.util.find_spec("flash_attn") is None:  # a GPU kernel this machine lacks: named too
        with pytest.raises(ImportError, match=key + "'flash_attention_2'"):
            load_causal_lm(
                ModelConfig(path=model_dir, override_config={"attn_implementation": "flash_attention_2"})
            )


def test_cpu_under_bf16_autocast_defaults_to_the_cpu_attention_elsewhere_sdpa():
    cpu = torch.device("cpu")
    assert default_attention(cpu, _fsdp(cpu_autocast=True)) == cpu_attention.CPU_ATTENTION
    assert default_attention(cpu, _fsdp(cpu_autocast=False)) is None  # fp32 compute: SDPA, as recorded
    assert default_attention(cpu, _fsdp(cpu_autocast=True, param_dtype="fp32")) is None
    assert default_attention(torch.device("cuda"), _fsdp(cpu_autocast=True)) is None


def test_cpu_attention_is_eager_while_scores_are_small_then_sdpa_and_as_accurate(model_dir, monkeypatch):
    """In fp32 the CPU attention equals eager attention exactly, and SDPA to rounding once a call's
    scores exceed the budget; in bf16 its error against fp32 SDPA is no larger than SDPA's own
    (both are bf16's, dominated by the matrix products around attention)."""
    model = load_causal_lm(ModelConfig(path=model_dir)).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 15, (8, 24), generator=g)
    mask = torch.ones_like(ids)
    for row in range(8):
        mask[row, :row] = 0  # left-padded prompts of different lengths
    micro = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, 12:],
    }

    def log_probs(attention: str, bf16: bool) -> torch.Tensor:
        model.set_attn_implementation(attention)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return response_log_probs(model, micro, 1.0)["log_probs"]

    name = cpu_attention.register()
    exact = log_probs("sdpa", bf16=False)
    assert torch.equal(log_probs(name, bf16=False), log_probs("eager", bf16=False))
    torch.testing.assert_close(log_probs("eager", bf16=False), exact, rtol=1e-5, atol=1e-5)
    sdpa_error = (log_probs("sdpa", bf16=True) - exact).abs().mean()
    cpu_error = (log_probs(name, bf16=True) - exact).abs().mean()
    assert sdpa_error > 0  # bf16 did round
    assert cpu_error <= 1.5 * sdpa_error, (cpu_error, sdpa_error)

    monkeypatch.setattr(cpu_attention, "EAGER_SCORES_MAX", 8 * 2 * 24 * 24 - 1)  # this batch's is above
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k)
    )
    torch.testing.assert_close(log_probs(name, bf16=False), exact, rtol=1e-5, atol=1e-5)
    assert calls  # SDPA ran
    with_bf16 = log_probs(name, bf16=True)  # SDPA under autocast with the eager path's float mask
    assert (with_bf16 - exact).abs().mean() <= 1.5 * sdpa_error


def test_the_critic_under_cpu_autocast_loads_the_cpu_attention(monkeypatch, builtin_assets):
    from tests.workers.test_packing import _batch, _start, _tokenizer

    worker, _ = _start(
        monkeypatch,
        [
            f"actor_rollout_ref.model.path={builtin_assets['model']}",
            "algorithm.adv_estimator=gae",
            "critic.model.fsdp_config.mixed_precision.cpu_autocast=True",
        ],
        "critic",
    )
    try:
        assert worker.engine.module.config._attn_implementation == cpu_attention.CPU_ATTENTION
        values = worker.compute_values(_batch(_tokenizer(builtin_assets), 1)).batch["values"]
        assert torch.isfinite(values).all() and values.abs().sum() > 0
    finally:
        torch.distributed.destroy_process_group()
