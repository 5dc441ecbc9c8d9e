"""The weight-sync check sees one stale sync in bf16 at verl's learning rate (1e-6), where a
missed update moves the probe's log-probs by far less than bf16 rounding: fault injections that
wrap the engine's weight loading (it does nothing; it skips one layer; it leaves the LM head stale)
are caught at the first step, and a healthy 40-step bf16 run raises no false alarm. Each case
drives the colocated worker (actor + rollout) directly, with a tiny loop of update + sync."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.workers.rollout.gap import GapSums

BF16_AT_VERL_LR = [
    "actor_rollout_ref.rollout.use_dtype_on_cpu=True",  # rollout.dtype: bfloat16
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.cpu_autocast=True",  # param_dtype: bf16
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.rollout.load_format=auto",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "trainer.n_gpus_per_node=1",
]
VLLM = pytest.param(
    "vllm",
    marks=[
        pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
        pytest.mark.slow,
    ],
)
BACKENDS = ["hf", VLLM]
HEALTHY_STEPS = 40
"""Syncs of the healthy run: each hashes a new sample of columns (per version) and scores the probe;
at lr 1e-6 the log-prob gap does not grow with steps (measured flat over 100)."""


def update_batch(tokenizer, seed: int, with_rollout_log_probs: bool = False) -> DataProto:
    """Eight responses with random advantages (no ``old_log_probs``: the update is on-policy)."""
    g = torch.Generator().manual_seed(seed)
    rows, prompt, response = 8, 6, 5
    ids = torch.randint(5, 14, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    mask[1::2, -2:] = 0
    ids[mask == 0] = tokenizer.pad_token_id
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt:],
        "response_mask": mask[:, prompt:].clone(),
        "advantages": torch.randn(rows, response, generator=g) * mask[:, prompt:],
    }
    if with_rollout_log_probs:
        tensors["rollout_log_probs"] = -torch.rand(rows, response, generator=g) * 3 * mask[:, prompt:]
    data = DataProto.from_dict(
        tensors, non_tensors={"uid": np.array([str(i) for i in range(rows)], dtype=object)}
    )
    data.meta_info["temperature"] = 1.0
    return data


# ---------------------------------------------------------------------------- faults
def _drop_layer_one(rollout, named_tensors):
    """The load skips every tensor of decoder layer 1 (vLLM keeps the old ones; the hf rollout,
    which refuses a partial update, is handed its own old tensors for them)."""
    own = dict(rollout.module.state_dict()) if hasattr(rollout, "module") else {}
    for name, tensor in named_tensors:
        if ".layers.1." not in name:
            yield name, tensor
        elif own:
            yield name, own[name].clone()


def _stale_hf_head(rollout, named_tensors):
    """The hf rollout is handed its own old LM head (tied: the embeddings go back with it)."""
    old_head = rollout.module.state_dict()["lm_head.weight"].clone()
    for name, tensor in named_tensors:
        yield name, (old_head if name == "lm_head.weight" else tensor)


def _keep_packed_head(worker) -> None:
    model = worker.model_runner.model
    worker.stale_head_kernel = model.lm_head.cpu_linear


def _restore_packed_head(worker) -> None:
    worker.model_runner.model.lm_head.cpu_linear = worker.stale_head_kernel


def install_fault(rollout, fault: str, load) -> None:
    """Make ``rollout.update_weights`` (the engine's weight loading) run ``load`` with ``fault``."""

    def faulty(named_tensors, version):
        if fault == "nothing":
            for _ in named_tensors:
                pass
            rollout.version = version
        elif fault == "skip_layer":
            load(_drop_layer_one(rollout, named_tensors), version)
        elif fault == "stale_head" and hasattr(rollout, "module"):
            load(_stale_hf_head(rollout, named_tensors), version)
        elif fault == "stale_head":  # vLLM on CPU: the tied head's packed copy survives the reload
            rollout.llm.collective_rpc(_keep_packed_head)
            load(named_tensors, version)
            rollout.llm.collective_rpc(_restore_packed_head)

    rollout.update_weights = faulty


WORLD_OF_ONE = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", VERL_DEVICE="cpu")


class SyncHarness:
    """A colocated actor + rollout (world size 1) that trains on random batches and syncs; one per
    backend serves every test of this module (an engine start costs more than the tests)."""

    def __init__(self, backend: str, env: dict[str, str] | None = None) -> None:
        os.environ.update(env or {})
        from verl.config.ppo_trainer import load_config
        from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

        config = load_config([f"actor_rollout_ref.rollout.name={backend}", *BF16_AT_VERL_LR])
        self.worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor_rollout")
        self.worker.init_model()
        self.healthy_load = self.worker.rollout.update_weights
        self.version = 0

    def run(self, steps: int, fault: str | None = None) -> dict:
        """Update and sync ``steps`` times, the loads made faulty by ``fault``; the probe gaps, or
        the first error's message and how many syncs it took. A failed sync leaves the engine
        stale: the next healthy one loads every weight again."""
        from verl.workers.rollout import WeightSyncError

        if fault is not None:
            install_fault(self.worker.rollout, fault, self.healthy_load)
        gaps = []
        try:
            for step in range(1, steps + 1):
                self.version += 1
                self.worker.update_actor(update_batch(self.worker.tokenizer, self.version))
                try:
                    gaps.append(self.worker.update_weights(self.version)["rollout/weight_sync_probe_gap"])
                except WeightSyncError as error:
                    return {"step": step, "version": self.version, "error": str(error), "gaps": gaps}
            return {"step": steps, "version": self.version, "error": None, "gaps": gaps}
        finally:
            self.worker.rollout.update_weights = self.healthy_load


@pytest.fixture(scope="module", params=BACKENDS)
def harness(request, ray_session, builtin_assets):
    """The hf rollout in this process; a vLLM engine in a Ray actor of its own (an engine, once
    started, keeps process-wide state). Returns ``run(steps, fault)``."""
    if request.param == "hf":
        with pytest.MonkeyPatch.context() as patch:
            for key, value in WORLD_OF_ONE.items():
                patch.setenv(key, value)
            patch.delenv("MASTER_PORT", raising=False)
            yield SyncHarness("hf").run
        return
    import ray

    actor = ray.remote(num_cpus=0)(SyncHarness).remote("vllm", WORLD_OF_ONE)
    try:
        yield lambda steps, fault=None: ray.get(actor.run.remote(steps, fault), timeout=600)
    finally:
        ray.kill(actor)


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize(
    ("fault", "stale"),
    [("nothing", "model.layers.0"), ("skip_layer", "model.layers.1"), ("stale_head", "lm_head")],
)
def test_a_stale_sync_in_bf16_is_caught_at_the_first_step(harness, fault, stale):
    result = harness(3, fault)
    assert result["step"] == 1, result
    assert f"weight sync to version {result['version']} failed verification" in result["error"]
    assert stale in result["error"] and "compared exactly, in bfloat16" in result["error"]
    if fault != "nothing":  # a partial fault names only what it left stale
        assert "model.layers.2" not in result["error"]


@pytest.mark.slow  # 40 updates, each checked against a fresh sample of columns: about 20 s on 2 cores
def test_a_healthy_bf16_run_raises_no_false_alarm_in_40_steps(harness):
    result = harness(HEALTHY_STEPS)
    assert result["error"] is None, result["error"]
    assert len(result["gaps"]) == HEALTHY_STEPS
    assert max(result["gaps"]) < 0.15  # the log-prob probe, next to the exact one, stays within bf16's


def test_gap_sums_pooled_over_micro_batches_equal_the_whole_batch():
    g = torch.Generator().manual_seed(0)
    rollout, trainer = -torch.rand(6, 7, generator=g) * 4, -torch.rand(6, 7, generator=g) * 4
    mask = torch.rand(6, 7, generator=g) > 0.3
    whole = GapSums.of(rollout, trainer, mask).metrics()
    pooled = sum(
        (GapSums.of(rollout[i : i + 2], trainer[i : i + 2], mask[i : i + 2]) for i in (0, 2, 4)), GapSums()
    )
    diff = (rollout[mask].exp() - trainer[mask].exp()).abs()
    expected = {
        "training/rollout_probs_diff_max": diff.max(),
        "training/rollout_probs_diff_mean": diff.mean(),
        "training/rollout_probs_diff_std": diff.std(),
        "training/rollout_logprob_diff_max": (rollout[mask] - trainer[mask]).abs().max(),
    }
    for key, value in expected.items():
        assert whole[key] == pytest.approx(float(value), rel=1e-6), key
        assert pooled.metrics()[key] == pytest.approx(float(value), rel=1e-6), key
    assert GapSums.of(rollout, trainer, torch.zeros_like(mask)).metrics() == {}


def test_an_on_policy_update_reports_the_rollout_trainer_gap_from_its_own_forward(
    monkeypatch, builtin_assets
):
    """Without the old-log-prob pass the update's forward gives the gap, pooled over its two
    micro-batches: it equals the gap against a separate forward of the same weights."""
    from tests.workers.test_packing import _start

    worker, _ = _start(monkeypatch, ["actor_rollout_ref.rollout.name=hf", *BF16_AT_VERL_LR[2:]], "actor")
    batch = update_batch(worker.tokenizer, 0, with_rollout_log_probs=True)
    before = worker.compute_log_prob(batch).batch["old_log_probs"]
    metrics = worker.update_actor(batch).meta_info["metrics"]
    expected = GapSums.of(batch.batch["rollout_log_probs"], before, batch.batch["response_mask"]).metrics()
    assert set(expected) <= set(metrics)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # with old_log_probs given (the pass ran) the driver reports the gap, not the update
    batch = update_batch(worker.tokenizer, 1, with_rollout_log_probs=True)
    batch.union(worker.compute_log_prob(batch).select(batch_keys=["old_log_probs"]))
    assert "training/rollout_probs_diff_max" not in worker.update_actor(batch).meta_info["metrics"]
