"""The training engine on one CUDA device: offloading and Liger's kernels. Skipped without CUDA.

``fsdp_config.param_offload`` / ``optimizer_offload`` must change where the weights and the
optimizer state live between calls, not what an update computes; ``use_liger`` must swap the
model's kernels, not its outputs. Both single-GPU layouts run (FSDP2 and the plain module).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist

from verl.config.engine import FSDPConfig, OptimConfig
from verl.workers.engine import fsdp as fsdp_engine
from verl.workers.engine.fsdp import FSDPEngine
from verl.workers.forward import response_log_probs

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def process_group():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


VOCAB = 15  # the built-in tiny model's


def _model(builtin_assets):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(builtin_assets["model"], dtype=torch.float32)
    assert model.config.vocab_size >= VOCAB
    return model


def _micro(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": mask.cumsum(-1) - 1,
        "responses": ids[:, 6:],
    }


def _loss(module, micro):
    lp = response_log_probs(module, micro, 1.0)["log_probs"]
    return -lp.mean(), {"loss": float(lp.detach().mean())}


def _engine(builtin_assets, offload: bool) -> FSDPEngine:
    config = FSDPConfig(param_offload=offload, optimizer_offload=offload)
    return FSDPEngine(_model(builtin_assets), torch.device("cuda"), config, optim=OptimConfig(lr=1e-3))


def _device_of_state(engine: FSDPEngine) -> set[str]:
    """Where AdamW's moments are (its step count is a CPU scalar either way)."""
    moments = [s[k] for s in engine.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
    assert moments
    return {m.device.type for m in moments}


@pytest.mark.parametrize("shard_one_gpu", [True, False], ids=["fsdp2", "plain"])
def test_offload_moves_state_between_calls_and_computes_the_same(
    process_group, builtin_assets, shard_one_gpu
):
    fsdp_engine.SHARD_ONE_GPU = shard_one_gpu
    try:
        resident = _engine(builtin_assets, offload=False)
        offloaded = _engine(builtin_assets, offload=True)
    finally:
        fsdp_engine.SHARD_ONE_GPU = True
    assert resident.sharded == offloaded.sharded == shard_one_gpu
    assert {p.device.type for p in offloaded.module.parameters()} == {"cpu"}
    for step in range(2):
        micro = [_micro(step), _micro(step + 10)]
        got = offloaded.train_step(micro, _loss, [0.5, 0.5])
        want = resident.train_step(micro, _loss, [0.5, 0.5])
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        # between calls: weights and optimizer state in host memory, on the GPU for the resident one
        assert {p.device.type for p in offloaded.module.parameters()} == {"cpu"}
        assert _device_of_state(offloaded) == {"cpu"} and _device_of_state(resident) == {"cuda"}
    for a, b in zip(resident.full_state_dict(), offloaded.full_state_dict()):
        assert a[0] == b[0]
        torch.testing.assert_close(a[1].cpu(), b[1].cpu(), rtol=1e-4, atol=1e-5)
    out = offloaded.infer([_micro(5)], lambda m, b: response_log_probs(m, b, 1.0))[0]["log_probs"]
    ref = resident.infer([_micro(5)], lambda m, b: response_log_probs(m, b, 1.0))[0]["log_probs"]
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
    assert {p.device.type for p in offloaded.module.parameters()} == {"cpu"}


def test_liger_kernels_replace_the_model_s_and_agree(builtin_assets):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("liger_kernel", reason="use_liger needs the liger-kernel package")
    from verl.utils.model import apply_liger

    micro = {k: v.cuda() for k, v in _micro(0).items()}

    def log_probs(model):
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            return response_log_probs(model, micro, 1.0)["log_probs"]

    want = log_probs(_model(builtin_assets).cuda())  # before liger patches transformers' RoPE function
    patched = apply_liger(_model(builtin_assets), "actor_rollout_ref.model.use_liger").cuda()
    names = {m._get_name() for m in patched.modules()}  # liger renames the modules it patches
    assert any(name.startswith("Liger") for name in names), names
    got = log_probs(patched)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)
