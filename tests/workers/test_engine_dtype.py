"""``fsdp_config.model_dtype`` sets the dtype the engine holds and trains the weights in;
``fsdp_config.mixed_precision`` the GPU compute, gradient-reduction and buffer dtypes."""

from __future__ import annotations

import pytest
import torch

from verl.config.engine import FSDPConfig, MixedPrecisionConfig, OptimConfig
from verl.workers.engine.fsdp import FSDPEngine, cast_float_buffers, mixed_precision_policy


@pytest.mark.parametrize(
    "name, dtype", [(None, torch.float32), ("bf16", torch.bfloat16), ("float16", torch.float16)]
)
def test_model_dtype_sets_the_weight_dtype(name, dtype):
    engine = FSDPEngine(
        torch.nn.Linear(4, 2), torch.device("cpu"), FSDPConfig(model_dtype=name), optim=OptimConfig()
    )
    assert {p.dtype for p in engine.module.parameters()} == {dtype}


def test_a_bf16_engine_trains():
    engine = FSDPEngine(
        torch.nn.Linear(4, 1), torch.device("cpu"), FSDPConfig(model_dtype="bf16"), optim=OptimConfig(lr=0.1)
    )
    before = engine.module.weight.detach().clone()
    micro = {"x": torch.ones(3, 4, dtype=torch.bfloat16)}

    def loss_fn(module, batch):
        loss = module(batch["x"]).float().pow(2).mean()
        return loss, {"loss": float(loss)}

    metrics = engine.train_step([micro], loss_fn, [1.0])
    assert metrics["update_skipped"] == 0.0
    assert not torch.equal(before, engine.module.weight)


# ---------------------------------------------------------------------------- fsdp_config.mixed_precision
def test_mixed_precision_applies_on_gpu_only():
    assert mixed_precision_policy(FSDPConfig(), "cpu") is None
    default = mixed_precision_policy(FSDPConfig(), "cuda")
    assert (default.param_dtype, default.reduce_dtype) == (torch.bfloat16, torch.float32)
    chosen = FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="fp32", reduce_dtype="bf16"))
    policy = mixed_precision_policy(chosen, "cuda")
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.float32, torch.bfloat16)


def test_buffer_dtype_casts_the_floating_point_buffers_only():
    module = torch.nn.Module()
    module.register_buffer("inv_freq", torch.ones(3, dtype=torch.bfloat16), persistent=False)
    module.register_buffer("steps", torch.zeros(2, dtype=torch.int64))
    module.child = torch.nn.BatchNorm1d(4).to(torch.bfloat16)
    cast_float_buffers(module, torch.float32)
    assert module.inv_freq.dtype == torch.float32 and module.steps.dtype == torch.int64
    assert module.child.running_mean.dtype == torch.float32
    assert module.child.num_batches_tracked.dtype == torch.int64
    assert module.child.weight.dtype == torch.bfloat16  # parameters keep model_dtype


@pytest.mark.gpu
def test_the_gpu_engine_computes_in_param_dtype_and_holds_buffers_in_buffer_dtype():
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        module = torch.nn.Sequential(torch.nn.Linear(4, 4))
        module.register_buffer("inv_freq", torch.ones(4), persistent=False)
        mp = MixedPrecisionConfig(param_dtype="fp32", buffer_dtype="bf16")
        engine = FSDPEngine(module, torch.device("cuda"), FSDPConfig(mixed_precision=mp))
        assert engine.module.inv_freq.dtype == torch.bfloat16
        out = engine.module(torch.ones(2, 4, device="cuda"))
        assert out.dtype == torch.float32  # the default bf16 compute would give bf16
    finally:
        if created:
            dist.destroy_process_group()
