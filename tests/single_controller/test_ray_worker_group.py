"""The single controller on a real local Ray: dispatch modes, colocation, pools, failures."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

from tests.single_controller.workers import EchoWorker, OtherRoleWorker
from verl.protocol import DataProto
from verl.single_controller import WorkerDiedError, WorkerGroupFuture, WorkerMethodError, WorkerTimeoutError
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolError,
    ResourcePoolManager,
    create_colocated_worker_groups,
)
from verl.single_controller.ray.resource_pool import REUSE_ENV


@pytest.fixture(scope="module")
def echo_group(ray_session):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="echo", cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker, tag="t"), role="echo", call_timeout_s=60)
    yield wg
    wg.shutdown()
    pool.release()


def test_one_to_all_broadcasts_and_lists_results(echo_group):
    assert echo_group.whoami("!") == [(0, 2, "t!"), (1, 2, "t!")]


def test_all_to_all_gives_each_rank_its_entry(echo_group):
    assert echo_group.add_rank([10, 20]) == [10, 21]
    with pytest.raises(ValueError, match="one entry per rank"):
        echo_group.add_rank([1, 2, 3])


def test_rank_zero_dispatch_and_execute(echo_group):
    assert echo_group.only_rank_zero(7) == (0, 7)
    assert echo_group.broadcast_but_rank_zero(8) == (0, 8)


def test_dp_compute_proto_with_uneven_batch_keeps_order(echo_group):
    data = DataProto.from_dict({"x": torch.arange(5).float()}, {"uid": np.array(list("abcde"), dtype=object)})
    out = echo_group.double(data)
    assert len(out) == 5
    assert torch.equal(out.batch["y"], torch.arange(5).float() * 2)
    assert list(out.non_tensor_batch["uid"]) == list("abcde")
    # padded to 6 rows: rank 0 computed rows 0-2, rank 1 rows 3-4 (its 6th row was padding)
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]


def test_non_blocking_returns_future(echo_group):
    future = echo_group.sleep(0.2, blocking=False)
    assert isinstance(future, WorkerGroupFuture)
    assert future.get() == [0, 1]


def test_ranks_form_a_gloo_group(echo_group):
    # ranks contribute 1 and 2: the all-reduced sum is 3 on both
    assert echo_group.all_reduce_rank() == [3.0, 3.0]


def test_method_error_names_role_rank_and_method(echo_group):
    with pytest.raises(WorkerMethodError, match=r"role 'echo' rank 1 raised in fail_on_rank\(\)"):
        echo_group.fail_on_rank(1)
    assert echo_group.whoami() == [(0, 2, "t"), (1, 2, "t")]  # the group still works


def test_timeout_names_the_late_ranks(echo_group):
    with pytest.raises(
        WorkerTimeoutError, match=r"rank\(s\) \[0, 1\] did not finish sleep\(\) within"
    ) as error:
        echo_group.sleep(3, blocking=False).get(timeout_s=0.5)
    assert "--- role 'echo' rank 1" in str(error.value)  # each late rank's stack follows
    time.sleep(3)  # let the sleeping call finish so later tests are not queued behind it


@pytest.mark.slow
def test_a_stuck_worker_s_time_out_shows_its_stack(ray_session):
    """A rank stuck in a pure-Python loop: the time-out error holds that rank's stack, naming the
    function it is stuck in (taken by a signal while the call still runs)."""
    pool = RayResourcePool([1], use_gpu=False, name_prefix="stuck", cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), role="stuck", call_timeout_s=600)
    try:
        future = wg.spin(blocking=False)
        deadline = time.monotonic() + 120  # until the call runs (a busy machine may start it late)
        while "_spin_forever_in_a_python_loop" not in wg.dump_stacks()[0]:
            assert time.monotonic() < deadline, "spin() never started"
        with pytest.raises(WorkerTimeoutError) as error:
            future.get(timeout_s=1)
        message = str(error.value)
        assert "role 'stuck' rank(s) [0] did not finish spin() within 1s" in message
        assert "_spin_forever_in_a_python_loop" in message and f"pid {wg.pids[0]}" in message
    finally:
        wg.shutdown()
        pool.release()


def test_colocated_roles_share_one_process_per_rank(ray_session):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="coloc", cpus_per_process=0.5)
    groups = create_colocated_worker_groups(
        pool, {"actor": RayClassWithInitArgs(EchoWorker), "critic": RayClassWithInitArgs(OtherRoleWorker)}
    )
    try:
        actor, critic = groups["actor"], groups["critic"]
        assert actor is not critic and actor.role == "actor" and critic.role == "critic"
        assert actor.pid() == critic.pid()
        assert len(set(actor.pid())) == 2 and os.getpid() not in actor.pid()
        assert critic.role_name() == ["other", "other"]
        assert not hasattr(critic, "whoami")
    finally:
        groups["actor"].shutdown()
        pool.release()


def test_pool_larger_than_cluster_is_a_clear_error(ray_session):
    pool = RayResourcePool([64], use_gpu=False, name_prefix="huge")
    with pytest.raises(ResourcePoolError, match="needs 64 CPUs"):
        RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker))


# after the colocation test: its ranks start in the processes that one kept (VERL_REUSE_WORKER_PROCESSES)
def test_killed_worker_is_a_clear_error_within_30s(ray_session):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="kill", cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), role="actor_rollout")
    try:
        start = time.monotonic()
        with pytest.raises(
            WorkerDiedError,
            match=r"role 'actor_rollout' rank 1 \(node \w+, pid \d+\): worker process died during exit_on_rank",
        ):
            wg.exit_on_rank(1)
        assert time.monotonic() - start < 30
    finally:
        wg.shutdown()
        pool.release()
    with pytest.raises(WorkerDiedError, match="shut down"):
        wg.whoami()


@pytest.mark.slow
def test_split_pools_use_distinct_bundles(ray_session, monkeypatch):
    # reuse off (the default): ranks run inside their bundles (with reuse, a CPU rank runs beside its
    # bundle, holding no CPU itself, so that its process can be kept; test_process_reuse.py)
    monkeypatch.setenv(REUSE_ENV, "0")
    manager = ResourcePoolManager(
        {"train": [1], "rollout": [1]},
        {"actor": "train", "rollout": "rollout"},
        use_gpu=False,
        cpus_per_process=0.5,
    )
    train = RayWorkerGroup(manager.get_resource_pool("actor"), RayClassWithInitArgs(EchoWorker), role="actor")
    rollout = RayWorkerGroup(
        manager.get_resource_pool("rollout"), RayClassWithInitArgs(EchoWorker), role="rollout"
    )
    try:
        (train_bundle,), (rollout_bundle,) = train.bundle(), rollout.bundle()
        assert train_bundle != rollout_bundle
        assert train.pid() != rollout.pid()
        assert manager.roles_by_pool() == {"train": ["actor"], "rollout": ["rollout"]}
    finally:
        train.shutdown()
        rollout.shutdown()
        manager.release()
