"""Workers and groups written against verl's single-controller API run unchanged: verl's import
paths, ``@ray.remote`` worker classes, verl's keyword arguments, ``create_colocated_worker_cls`` +
``spawn``, custom dispatch functions and the n-d (device mesh) dispatch, on a real local Ray."""

from __future__ import annotations

import os

import numpy as np
import pytest
import ray
import torch

from verl.protocol import DataProto
from verl.single_controller.base import ClassWithInitArgs, ResourcePool, Worker, WorkerGroup
from verl.single_controller.base.decorator import (
    Dispatch,
    Execute,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.single_controller.ray.base import create_colocated_worker_cls
from verl.single_controller.ray.resource_pool import ResourcePoolError


def _scatter(worker_group, x):
    return ([x + 10 * rank for rank in range(worker_group.world_size)],), {}


def _total(worker_group, outputs):
    return sum(outputs)


def _with_rank(worker, data: DataProto) -> DataProto:
    return DataProto.from_dict({"x": data.batch["x"], "rank": torch.full((len(data),), worker.rank)})


@ray.remote
class MyWorker(Worker):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        # as tensor parallelism of 2 would: both ranks are data-parallel rank 0, rank 0 answers
        self._register_dispatch_collect_info("tp2", dp_rank=0, is_collect=self.rank == 0)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data):
        n = len(data)
        return DataProto.from_dict(
            {"y": data.batch["x"] * self.scale, "rank": torch.full((n,), self.rank)},
            {"uid": data.non_tensor_batch["uid"], "world": np.array([self.world_size] * n, dtype=object)},
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def place(self):
        return {
            "rank": self.rank,
            "_rank": self._rank,
            "world_size": self.world_size,
            "master": self.get_master_addr_port(),
            "devices": self.get_cuda_visible_devices(),
            "env_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "not set"),
            "local": (os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]),
        }

    @register(dispatch_mode={"dispatch_fn": _scatter, "collect_fn": _total})
    def plus_rank(self, x):
        return x + self.rank

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="tp2"))
    def tp_rows(self, data):
        return _with_rank(self, data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def pid(self):
        return os.getpid()

    def add(self, x):  # not registered: reachable with execute_all_sync
        return x + self.rank


@ray.remote
class Critic(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()


def rows(n: int) -> DataProto:
    uid = np.array([f"u{i}" for i in range(n)], dtype=object)
    return DataProto.from_dict({"x": torch.arange(n).float()}, {"uid": uid})


@pytest.fixture(scope="module")
def pool_and_group(ray_session):
    # verl's README example, verbatim
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=MyWorker, scale=2))
    yield pool, wg
    wg.shutdown()
    pool.release()


@pytest.fixture
def wg(pool_and_group):
    return pool_and_group[1]


def test_names_import_from_verl_s_paths():
    assert issubclass(RayResourcePool, ResourcePool) and issubclass(RayWorkerGroup, WorkerGroup)
    assert issubclass(RayClassWithInitArgs, ClassWithInitArgs)
    from verl.single_controller import ClassWithInitArgs as top_level
    from verl.single_controller.ray import create_colocated_worker_cls as from_package

    assert top_level is ClassWithInitArgs and from_package is create_colocated_worker_cls
    assert {"ONE_TO_ALL", "DP_COMPUTE_PROTO_WITH_FUNC", "DP_COMPUTE_METRIC", "DIRECT_ROLLOUT_METHOD"} <= set(
        Dispatch.names()
    )


def test_a_ray_remote_class_is_unwrapped_to_the_plain_class():
    spec = RayClassWithInitArgs(cls=MyWorker, scale=3)
    assert spec.cls is MyWorker.__ray_actor_class__ and spec.kwargs == {"scale": 3}
    with pytest.raises(ValueError, match=r"declared with @ray.remote\(\{'num_cpus': 1\}\)"):
        RayClassWithInitArgs(ray.remote(num_cpus=1)(spec.cls))


def test_resource_pool_lists_ranks_per_node():
    pool = ResourcePool([2, 3])
    assert pool.world_size == 5 and pool.store == [2, 3]
    assert pool.local_rank_list() == [0, 1, 0, 1, 2]
    assert pool.local_world_size_list() == [2, 2, 3, 3, 3]


# before the module's group (pool_and_group) starts: that pool takes both of the session's CPUs
def test_colocated_worker_cls_spawns_one_group_per_role_in_the_same_processes(ray_session):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, cpus_per_process=0.5)
    class_dict = {
        "actor": RayClassWithInitArgs(cls=MyWorker, scale=3),
        "critic": RayClassWithInitArgs(cls=Critic),
    }
    wg_dict = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(class_dict))
    try:
        spawn_wg = wg_dict.spawn(prefix_set=class_dict.keys())
        actor, critic = spawn_wg["actor"], spawn_wg["critic"]
        pids = critic.pid()
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert actor.execute_all_sync("get_pid") == pids
        assert actor.double(rows(2)).batch["y"].tolist() == [0.0, 3.0]
        assert wg_dict.critic_pid() == pids  # verl's prefixed methods on the colocated group
        assert not hasattr(critic, "double")
    finally:
        wg_dict.shutdown()
        pool.release()


def test_dp_compute_proto_pads_an_odd_batch_splits_it_and_restores_order(wg):
    out = wg.double(rows(5))
    assert len(out) == 5
    assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3", "u4"]
    # padded to 6: rank 0 got rows 0-2, rank 1 rows 3-4 and the padding row, dropped again
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert set(out.non_tensor_batch["world"]) == {2}


def test_each_rank_knows_its_place_and_the_rendezvous(wg):
    places = wg.place()
    assert [p["rank"] for p in places] == [0, 1] == [p["_rank"] for p in places]
    assert {p["world_size"] for p in places} == {2}
    (addr, port), other = places[0]["master"], places[1]["master"]
    assert other == (addr, port) and addr and port.isdigit()
    assert all(p["devices"] == p["env_devices"] for p in places)
    assert [p["local"] for p in places] == [("0", "2"), ("1", "2")]
    assert wg.execute_all_sync("get_master_addr_port") == [(addr, port)] * 2


def test_verl_s_execute_calls_reach_any_method(wg):
    assert wg.execute_all_sync("add", x=[1, 1]) == [1, 2]  # one entry per rank
    assert wg.execute_all_sync("add", 5) == [5, 6]  # broadcast
    assert ray.get(wg.execute_all_async("add", 1)) == [1, 2]
    assert wg.execute_rank_zero_sync("add", 7) == 7
    assert ray.get(wg.execute_rank_zero_async("add", 7)) == 7
    assert isinstance(wg.pid(), int)  # Execute.RANK_ZERO: rank 0's result, unwrapped


def test_a_dict_of_dispatch_and_collect_functions_is_a_dispatch_mode(wg):
    # rank r gets 1 + 10 r and adds r: (1 + 0) + (11 + 1)
    assert wg.plus_rank(1) == 13


def test_nd_dispatch_sends_each_rank_its_dp_chunk_and_collects_the_marked_ranks(wg):
    out = wg.tp_rows(rows(3))
    assert out.batch["x"].tolist() == [0.0, 1.0, 2.0]
    assert out.batch["rank"].tolist() == [0, 0, 0]  # the whole batch went to dp rank 0; rank 0 answered


def test_function_generator_runs_a_driver_function_on_each_chunk(wg):
    out = wg.execute_with_func_generator(_with_rank, rows(4))
    assert out.batch["rank"].tolist() == [0, 0, 1, 1]


def test_a_second_group_on_a_full_pool_is_a_clear_error(pool_and_group):
    pool, _ = pool_and_group
    with pytest.raises(ResourcePoolError, match="max_colocate_count"):
        RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(MyWorker, scale=1))


def test_verl_arguments_that_cannot_be_honoured_are_refused_by_name(ray_session):
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=False)
    spec = RayClassWithInitArgs(MyWorker, scale=1)
    with pytest.raises(ValueError, match=r"detached=True.*worker_names.*profile_steps.*surprise \(unknown"):
        RayWorkerGroup(pool, spec, detached=True, worker_names=["a"], profile_steps=[1], surprise=1)
    with pytest.raises(ValueError, match="device_name='npu'"):
        RayWorkerGroup(resource_pool=pool, ray_cls_with_init=spec, device_name="npu")
    with pytest.raises(ValueError, match="detached=True"):
        RayResourcePool(process_on_nodes=[1], detached=True)
