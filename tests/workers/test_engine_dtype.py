"""``fsdp_config.model_dtype`` sets the dtype the engine holds and trains the weights in."""

from __future__ import annotations

import pytest
import torch

from verl.trainer.config.engine import FSDPConfig, OptimConfig
from verl.workers.engine.fsdp import FSDPEngine


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
