"""The Megatron engine's ``param_offload``, ``grad_offload`` and ``optimizer_offload`` (CPU, gloo).

Two ranks at tensor parallel 2 with the distributed optimizer run the same calls twice in one spawn,
offload off and all three on: three train steps, infer, full_state_dict, save, and a fresh engine
that loads the save and trains on. Every result is bit-identical, and between calls the offloaded
engine's storages are freed (size 0: the DDP param and grad buffers, every parameter, Adam's state)
while their bytes sit in separate host tensors. Code that read a freed storage would crash the rank
(a null data pointer), so the equal results also show that each call brought back what it used.
Real megatron-core 0.16.1 behind the test-only CPU shim (tests/megatron/cpu_shim.py).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.megatron.ranks import run_ranks
from tests.workers.engine.test_megatron_engine import (
    actor_loss,
    actor_outputs,
    batch,
    build_hf,
    optim_config,
    tiny_config,
)

WEIGHTS = [0.6, 0.4]
ALL = ["model", "optimizer", "extra"]


def engine(state, offload: bool, trains: bool = True, dtype: torch.dtype = torch.float32):
    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.megatron.engine import MegatronEngine

    megatron = MegatronConfig(
        tensor_model_parallel_size=2,
        use_distributed_optimizer=True,
        param_offload=offload,
        grad_offload=offload,
        optimizer_offload=offload,
    )
    module = build_hf(tiny_config(False), False, state)
    optim = optim_config() if trains else None
    return MegatronEngine(module, torch.device("cpu"), megatron, "test.megatron", dtype=dtype, optim=optim)


def _optimizer_tensors(engine) -> list[torch.Tensor]:
    parts = getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])
    tensors = []
    for part in parts:
        for group in part.optimizer.param_groups:
            tensors += group["params"]  # the fp32 main shards (views of the fp32 weights here)
        for state in part.optimizer.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def still_on_device(engine, when: str) -> list[str]:
    """What of an offloaded engine holds device memory between calls (empty: nothing)."""
    held = {f"parameter {n}": p for n, p in engine.module.named_parameters()}
    if engine.optimizer is not None:
        for i, buffer in enumerate(engine.module.buffers + engine.module.expert_parallel_buffers):
            held.update(
                {f"buffer {i} param_data": buffer.param_data, f"buffer {i} grad_data": buffer.grad_data}
            )
        held.update({f"optimizer tensor {i}": t for i, t in enumerate(_optimizer_tensors(engine))})
    return [
        f"{when}: {name} {t.untyped_storage().nbytes()} bytes"
        for name, t in held.items()
        if t.untyped_storage().nbytes()
    ]


def calls(state, folder: str, offload: bool) -> dict:
    """The engine's calls in order; with ``offload``, what stayed on the device after each."""
    from verl.workers.engine.megatron import offload as kinds

    first, micros = engine(state, offload), batch()
    out: dict = {"left": still_on_device(first, "built") if offload else [], "metrics": [], "host": []}

    def after(eng, when):
        if offload:
            out["left"] += still_on_device(eng, when)
            out["host"].append(
                (when, eng.offload.host_bytes(kinds.WEIGHTS), eng.offload.host_bytes(kinds.OPTIMIZER))
            )

    for step in range(2):
        out["metrics"].append(first.train_step(micros, actor_loss, WEIGHTS))
        first.lr_scheduler_step()
        after(first, f"train_step {step}")
    out["outs"] = first.infer(micros, actor_outputs)
    after(first, "infer")
    kept = first.weights_copy()  # what the async trainer keeps as the proximal policy
    out["kept_on_host"] = all(t.device.type == "cpu" and t.untyped_storage().nbytes() for t in kept)
    after(first, "weights_copy")
    out["weights"] = {name: t.clone() for name, t in first.full_state_dict()}
    after(first, "full_state_dict")
    first.save(folder, ALL)
    after(first, "save")
    out["metrics"].append(first.train_step(micros, actor_loss, WEIGHTS))
    with first.computing_with(kept):
        out["proximal"] = first.infer(micros, actor_outputs)
    after(first, "computing_with")
    out["after_proximal"] = first.infer(micros, actor_outputs)
    second = engine(state, offload)
    second.load(folder, ALL)
    after(second, "load")
    out["resumed"] = second.train_step(micros, actor_loss, WEIGHTS)
    after(second, "train_step after load")
    out["final"] = [{n: t.clone() for n, t in e.full_state_dict()} for e in (first, second)]
    reference = engine(state, offload, trains=False)  # inference only: each parameter offloaded
    out["reference"] = reference.infer(micros, actor_outputs)
    after(reference, "reference infer")
    return out


def bf16_step(state, offload: bool) -> dict:
    """bf16 weights: the distributed optimizer's fp32 main shards are storages of their own (as on a
    GPU), offloaded with Adam's moments."""
    bf16 = engine(state, offload, dtype=torch.bfloat16)
    metrics = bf16.train_step(batch(), actor_loss, WEIGHTS)
    main = [p for g in bf16.optimizer.optimizer.param_groups for p in g["params"]]
    return {
        "metrics": metrics,
        "weights": {name: t.clone() for name, t in bf16.full_state_dict()},
        "main": [(p.dtype, p.untyped_storage().nbytes()) for p in main],
        "left": still_on_device(bf16, "bf16 train_step") if offload else [],
    }


def offload_rank(rank, world, state, folder):
    return {
        offload: {**calls(state, folder[offload], offload), "bf16": bf16_step(state, offload)}
        for offload in (False, True)
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    state = build_hf(tiny_config(False), False).state_dict()
    folders = {offload: str(tmp_path_factory.mktemp(f"offload_{offload}")) for offload in (False, True)}
    return run_ranks(offload_rank, 2, state, folders)


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_offloading_changes_no_result_bit_for_bit(runs):
    for rank, got in enumerate(runs):
        plain, offloaded = got[False], got[True]
        for key in ("metrics", "outs", "weights", "resumed", "final", "reference"):
            assert same(plain[key], offloaded[key]), (rank, key)
        assert plain["resumed"] == plain["metrics"][-1]  # the loaded engine trains the saved one's step
        first, second = plain["final"]
        assert same(first, second)
        assert any(not torch.equal(plain["weights"][n], t) for n, t in first.items())  # the steps moved them


def test_between_calls_the_offloaded_storages_are_freed(runs):
    for rank, got in enumerate(runs):
        assert got[True]["left"] == [], rank
        for when, weights, optimizer in got[True]["host"]:
            assert weights > 0, (rank, when)  # the bytes live on in host memory
            if when != "reference infer":  # Adam's moments and step counts (fp32: the main weights
                assert optimizer > 0, (rank, when)  # are views of the weights)


def test_bf16_main_weights_are_offloaded_with_the_optimizer(runs):
    for rank, got in enumerate(runs):
        plain, offloaded = got[False]["bf16"], got[True]["bf16"]
        assert same(plain["metrics"], offloaded["metrics"]) and same(plain["weights"], offloaded["weights"])
        assert {dtype for dtype, _ in plain["main"]} == {torch.float32}
        assert all(size > 0 for _, size in plain["main"]), rank  # separate storages, resident without offload
        assert all(size == 0 for _, size in offloaded["main"]) and offloaded["left"] == [], rank


def test_kept_proximal_weights_compute_as_when_kept_with_the_weights_offloaded(runs):
    """verl's ``compute_prox_log_prob`` under ``param_offload``: the copy kept after step 2 (in host
    memory) gives step 2's outputs after step 3, and the engine then computes with its own again."""
    for rank, got in enumerate(runs):
        for offload in (False, True):
            run = got[offload]
            assert same(run["proximal"], run["outs"]), (rank, offload)
            assert not same(run["after_proximal"], run["outs"]), (rank, offload)  # step 3 moved them
        assert same(got[False]["after_proximal"], got[True]["after_proximal"]), rank
        assert got[True]["kept_on_host"], rank
