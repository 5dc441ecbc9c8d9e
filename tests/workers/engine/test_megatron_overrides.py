"""verl's override_transformer_config and optim.override_optimizer_config on the Megatron engine:
unknown fields named, the fused-kernel knobs of verl's big-model scripts set back to what megatron-core's
local layer spec runs (with a warning), the optimizer's TE-only and host-offload knobs dropped where
they cannot act. Config objects only: megatron-core's own dataclasses, no process group."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.workers.engine.test_megatron_moe import moe_config
from verl.config.base import ConfigError
from verl.workers.engine.megatron.arch import transformer_config
from verl.workers.engine.megatron.overrides import LOCAL_SPEC, optimizer_overrides

# what verl's examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh adds
QWEN3_MOE_SCRIPT = {
    "apply_rope_fusion": True,
    "masked_softmax_fusion": True,
    "bias_activation_fusion": True,
    "bias_dropout_fusion": True,
    "gradient_accumulation_fusion": True,
    "deallocate_pipeline_outputs": True,
    "persist_layer_norm": True,
    "moe_grouped_gemm": True,
    "moe_permute_fusion": True,
    "moe_token_dispatcher_type": "flex",
    "moe_router_dtype": "fp32",
    "moe_enable_deepep": True,
}
KEY = "actor_rollout_ref.actor.optim.override_optimizer_config"


def test_fused_kernel_knobs_fall_back_to_the_local_spec_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        config = transformer_config(
            moe_config("qwen3_moe"), tp=1, pp=1, dtype=torch.float32, overrides=QWEN3_MOE_SCRIPT
        )
    for name, local in LOCAL_SPEC.items():
        if name in QWEN3_MOE_SCRIPT:
            assert getattr(config, name) == local, name
            assert name in caplog.text
    assert config.moe_router_dtype == "fp32" and config.deallocate_pipeline_outputs  # the rest applies


def test_an_unknown_optimizer_override_is_named():
    with pytest.raises(
        ConfigError, match=rf"{KEY}\.adam_typo: expected a field of megatron-core's OptimizerConfig"
    ):
        optimizer_overrides({"adam_typo": 1.0}, torch.device("cpu"), KEY)


def test_optimizer_knobs_that_cannot_act_are_dropped_where_they_cannot(caplog):
    script = {  # the same script's optimizer overrides, and one that applies everywhere
        "optimizer_offload_fraction": 1.0,
        "overlap_cpu_optimizer_d2h_h2d": True,
        "use_precision_aware_optimizer": True,
        "optimizer_cpu_offload": True,
        "adam_eps": 1e-6,
    }
    with caplog.at_level(logging.WARNING):
        on_cpu = optimizer_overrides(script, torch.device("cpu"), KEY)
    assert on_cpu == {"optimizer_offload_fraction": 1.0, "adam_eps": 1e-6}
    assert "use_precision_aware_optimizer" in caplog.text and "host memory already" in caplog.text
    on_gpu = optimizer_overrides(script, torch.device("cuda"), KEY)  # a device name: no GPU needed
    assert on_gpu == {k: v for k, v in script.items() if k != "use_precision_aware_optimizer"}


def test_the_optimizer_override_is_refused_under_fsdp():
    from verl.config.ppo_trainer import load_config

    with pytest.raises(
        ConfigError, match=r"optim\.override_optimizer_config: expected null or \{\} with strategy=fsdp"
    ):
        load_config(["+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True"])
    config = load_config(
        [
            "actor_rollout_ref.actor.strategy=megatron",
            "+actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload=True",
        ]
    )
    assert config.actor_rollout_ref.actor.optim.override_optimizer_config == {"optimizer_cpu_offload": True}
