"""The attention implementation models load with: ``override_config.attn_implementation`` takes
effect (for the policy and the critic), and on CPU under bf16 autocast the engines' default is
transformers' eager attention, as accurate there as SDPA."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from verl.config.actor import ModelConfig
from verl.config.critic import CriticModelConfig
from verl.config.engine import FSDPConfig
from verl.utils.builtin import build_char_tokenizer, build_tiny_qwen2
from verl.utils.model import load_causal_lm, load_value_model
from verl.workers.engine.fsdp import cpu_attention
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


def test_cpu_under_bf16_autocast_defaults_to_eager_attention_elsewhere_sdpa():
    cpu = torch.device("cpu")
    assert cpu_attention(cpu, _fsdp(cpu_autocast=True)) == "eager"
    assert cpu_attention(cpu, _fsdp(cpu_autocast=False)) is None  # fp32 compute: SDPA, as recorded
    assert cpu_attention(cpu, _fsdp(cpu_autocast=True, param_dtype="fp32")) is None
    assert cpu_attention(torch.device("cuda"), _fsdp(cpu_autocast=True)) is None


def test_eager_bf16_log_probs_are_as_accurate_as_sdpas(model_dir):
    """Against fp32 SDPA: in fp32 the two agree to rounding, and in bf16 eager's error is no larger
    than SDPA's (both are bf16's, dominated by the matrix products around attention)."""
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

    exact = log_probs("sdpa", bf16=False)
    torch.testing.assert_close(log_probs("eager", bf16=False), exact, rtol=1e-5, atol=1e-5)
    sdpa_error = (log_probs("sdpa", bf16=True) - exact).abs().mean()
    eager_error = (log_probs("eager", bf16=True) - exact).abs().mean()
    assert sdpa_error > 0  # bf16 did round
    assert eager_error <= 1.5 * sdpa_error, (eager_error, sdpa_error)


def test_the_critic_under_cpu_autocast_loads_eager_attention(monkeypatch, builtin_assets):
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
        assert worker.engine.module.config._attn_implementation == "eager"
        values = worker.compute_values(_batch(_tokenizer(builtin_assets), 1)).batch["values"]
        assert torch.isfinite(values).all() and values.abs().sum() > 0
    finally:
        torch.distributed.destroy_process_group()
