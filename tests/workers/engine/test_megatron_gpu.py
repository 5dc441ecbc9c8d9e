"""The Megatron engine on one CUDA GPU, as megatron-core runs there (no shim): fp32 equals the FSDP
engine on the same weights and batch; bf16 (megatron's bf16 weights and fp32 main weights against
FSDP's bf16 compute over fp32 weights) agrees to bf16 rounding."""

from __future__ import annotations

import pytest
import torch

from tests.workers.engine.test_megatron_engine import FNS, batch, build_hf, close, optim_config, tiny_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _run(engine, value_head: bool) -> dict:
    infer_fn, loss_fn = FNS[value_head]
    micros = [{k: v.cuda() for k, v in m.items()} for m in batch()]
    outs = engine.infer(micros, infer_fn)
    metrics = engine.train_step(micros, loss_fn, [0.6, 0.4])
    return {"outs": outs, "metrics": metrics}


def _engines(value_head: bool, dtype: torch.dtype):
    from verl.config.engine import FSDPConfig
    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.fsdp import FSDPEngine
    from verl.workers.engine.megatron.engine import MegatronEngine
    from verl.workers.engine.megatron.groups import ensure_process_group

    ensure_process_group(torch.device("cuda"))  # FSDP2 and megatron-core share one group of one rank
    config = tiny_config(value_head)
    reference = build_hf(config, value_head)
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    fsdp_cfg = FSDPConfig()
    if dtype == torch.float32:
        fsdp_cfg.mixed_precision.param_dtype = "fp32"
    fsdp = FSDPEngine(reference, torch.device("cuda"), fsdp_cfg, optim=optim_config())
    module = build_hf(config, value_head, state)
    megatron = MegatronEngine(
        module,
        torch.device("cuda"),
        MegatronConfig(),
        "test.megatron",
        dtype=dtype,
        optim=optim_config(),
        value_head=value_head,
    )
    return fsdp, megatron


@pytest.mark.parametrize("value_head", [False, True], ids=["actor", "critic"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)], ids=["fp32", "bf16"])
def test_megatron_on_cuda_agrees_with_fsdp(value_head, dtype, tol):
    fsdp, megatron = _engines(value_head, dtype)
    want, have = _run(fsdp, value_head), _run(megatron, value_head)
    masks = [micro["response_mask"] for micro in batch()]  # what pads predict is read by no one
    for a, b, mask in zip(want["outs"], have["outs"], masks):
        for key in a:
            assert close(a[key] * mask, b[key] * mask) < tol, key
    assert abs(want["metrics"]["loss"] - have["metrics"]["loss"]) < tol
    assert abs(want["metrics"]["grad_norm"] - have["metrics"]["grad_norm"]) < tol * max(
        1.0, want["metrics"]["grad_norm"]
    )
