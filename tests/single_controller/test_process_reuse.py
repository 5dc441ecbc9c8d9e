"""VERL_REUSE_WORKER_PROCESSES=1: a later run in the same driver starts its roles in the worker
processes of a finished run (whatever the shape of either pool), gives the same numbers as fresh
processes, and never reuses a process that its roles left unclean (a thread, a model plugin) or
that died meanwhile."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import ray
import torch

from tests.trainer.test_algorithms_e2e import SHORT
from verl.config.ppo_trainer import load_config
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.base.worker import Worker
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    create_colocated_worker_groups,
    release_parked_workers,
)
from verl.single_controller.ray.resource_pool import REUSE_ENV
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.model import import_external_lib

# SHORT's 2 steps on half its rows (later keys win): the numbers compared are the same kinds
RUN = [
    *SHORT,
    "trainer.n_gpus_per_node=2",
    "trainer.cpus_per_worker=1",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
]
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/")


def gone(pid: int, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def run(reuse: str, monkeypatch) -> tuple[list[int], dict[str, float]]:
    monkeypatch.setenv(REUSE_ENV, reuse)
    trainer = RayPPOTrainer(load_config(RUN))
    try:
        trainer.init_workers()
        metrics = trainer.fit()
    finally:
        trainer.close()
    return trainer.actor_rollout_wg.pids, {k: v for k, v in metrics.items() if not k.startswith(VOLATILE)}


@pytest.fixture
def clean_start(ray_session):
    release_parked_workers()
    yield
    release_parked_workers()


@pytest.mark.slow
@pytest.mark.usefixtures("builtin_assets", "clean_start")
def test_a_later_run_reuses_the_processes_and_gives_the_same_numbers(monkeypatch):
    fresh_pids, fresh = run("1", monkeypatch)
    assert all(psutil.pid_exists(pid) for pid in fresh_pids)  # kept, not killed
    # in between, one of them serves a pool of another shape, one rank on both CPUs (kept processes
    # hold none), with that pool's rank, world size and threads
    other_shape = finished_ranks(ThreadsWorker, [1], cpus=2)
    assert set(other_shape) < set(fresh_pids) and list(other_shape.values()) == [(0, 1, 2, "2")]
    reused_pids, reused = run("1", monkeypatch)
    assert reused_pids == fresh_pids
    assert reused == fresh and "actor/pg_loss" in fresh

    off_pids, off = run("0", monkeypatch)  # reuse off: the kept processes end, new ones start
    assert off == fresh
    assert set(off_pids).isdisjoint(fresh_pids)
    assert all(gone(pid) for pid in fresh_pids + off_pids)


class ThreadLeavingWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        threading.Thread(target=time.sleep, args=(3600,), name="left-behind", daemon=True).start()

    def process_reusable(self) -> bool:
        return True


class PluginWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        import_external_lib("tests.single_controller.workers")  # as model.external_lib would

    def process_reusable(self) -> bool:
        return True


class CleanWorker(Worker):
    def process_reusable(self) -> bool:
        return True


class ThreadsWorker(CleanWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def place(self) -> tuple[int, int, int, str]:
        return self.rank, self.world_size, torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]


class ConcurrentWorker(CleanWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def thread_name(self) -> str:
        return threading.current_thread().name


def finished_ranks(worker_cls: type, process_on_nodes: list[int], cpus: float) -> dict[int, tuple]:
    """Process id -> (rank, world size, torch threads, OMP_NUM_THREADS) of each rank of a group of
    ``worker_cls`` after its run ended (group and pool closed)."""
    pool = RayResourcePool(process_on_nodes, use_gpu=False, name_prefix="shape", cpus_per_process=cpus)
    group = create_colocated_worker_groups(pool, {"w": RayClassWithInitArgs(worker_cls)})["w"]
    places = dict(zip(group.pids, group.place()))
    group.shutdown()
    pool.release()
    return places


def one_finished_process(worker_cls: type, max_concurrency: int = 1) -> int:
    """The pid of a one-rank group of ``worker_cls`` after its run ended (group and pool closed)."""
    pool = RayResourcePool([1], use_gpu=False, name_prefix="reuse", cpus_per_process=0.5)
    roles = {"w": RayClassWithInitArgs(worker_cls)}
    group = create_colocated_worker_groups(pool, roles, max_concurrency=max_concurrency)["w"]
    pid = group.pids[0]
    if max_concurrency > 1:  # a concurrent actor's calls run on Ray's threads, dummy threads to Python
        assert group.thread_name()[0].startswith("Dummy"), group.thread_name()
    group.shutdown()
    pool.release()
    return pid


@pytest.mark.usefixtures("clean_start")
@pytest.mark.parametrize("worker_cls", [ThreadLeavingWorker, PluginWorker, Worker])
def test_a_process_left_unclean_is_killed_not_kept(monkeypatch, worker_cls):
    monkeypatch.setenv(REUSE_ENV, "1")
    pid = one_finished_process(worker_cls)
    assert gone(pid)
    assert release_parked_workers() == 0


@pytest.mark.usefixtures("clean_start")
def test_the_threads_ray_runs_a_concurrent_actors_calls_on_do_not_stop_its_reuse(monkeypatch):
    """An async run's rollout host takes concurrent calls (generation beside weight updates): Ray's
    executor threads stay with the actor, so its process is kept like any clean one."""
    monkeypatch.setenv(REUSE_ENV, "1")
    pid = one_finished_process(ConcurrentWorker, max_concurrency=2)
    assert psutil.pid_exists(pid)
    assert release_parked_workers() == 1
    assert gone(pid)


@pytest.mark.slow
@pytest.mark.usefixtures("clean_start")
def test_a_kept_process_that_died_is_replaced(monkeypatch):
    monkeypatch.setenv(REUSE_ENV, "1")
    pid = one_finished_process(CleanWorker)
    assert psutil.pid_exists(pid)

    os.kill(pid, signal.SIGKILL)
    assert gone(pid)
    pool = RayResourcePool([1], use_gpu=False, name_prefix="reuse", cpus_per_process=0.5)
    group = create_colocated_worker_groups(pool, {"w": RayClassWithInitArgs(CleanWorker)})["w"]
    assert group.pids[0] != pid
    assert ray.get(group.workers[0].node_info.remote())  # the new process answers
    group.shutdown()
    pool.release()
    assert release_parked_workers() == 1
