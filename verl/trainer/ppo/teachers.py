"""The teachers of on-policy distillation, seen from the driver: route each sample to its teacher.

One teacher scores every sample. With several, a sample goes to the teacher whose ``key`` equals
its ``distillation.teacher_key`` column (``data_source`` by default), as in verl; a sample whose
value names no teacher is an error that names it. The scores come back in the batch's row order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.config.base import ConfigError
from verl.config.distillation import teacher_plan
from verl.protocol import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, create_colocated_worker_groups
from verl.workers.forward import POLICY_INPUT_KEYS
from verl.workers.vision import image_columns

GROUP_PREFIX = "teacher:"
"""A teacher's worker group is ``wgs["teacher:<key>"]``."""


class Teachers:
    def __init__(self, groups: dict[str, Any], routing_key: str) -> None:
        """``groups``: teacher key -> its worker group; ``routing_key``: the column that routes."""
        self.groups = groups
        self.routing_key = routing_key

    @classmethod
    def from_worker_groups(cls, wgs: dict[str, Any], routing_key: str) -> Teachers | None:
        groups = {
            name.removeprefix(GROUP_PREFIX): g for name, g in wgs.items() if name.startswith(GROUP_PREFIX)
        }
        return cls(groups, routing_key) if groups else None

    def score(self, batch: DataProto) -> DataProto:
        """The teachers' outputs for every row of ``batch`` (:class:`verl.workers.teacher.TeacherWorker`)."""
        inputs = batch.select(
            batch_keys=POLICY_INPUT_KEYS, non_tensor_batch_keys=image_columns(batch.non_tensor_batch)
        )
        if len(self.groups) == 1:
            return next(iter(self.groups.values())).compute_teacher_log_prob(inputs)
        rows = self._rows_by_teacher(batch)
        parts = {
            key: self.groups[key].compute_teacher_log_prob(inputs.select_idxs(idx))
            for key, idx in rows.items()
        }
        first = next(iter(parts.values())).batch
        merged = {k: torch.empty((len(batch), *v.shape[1:]), dtype=v.dtype) for k, v in first.items()}
        for key, idx in rows.items():
            for name, values in parts[key].batch.items():
                merged[name][torch.as_tensor(idx)] = values
        return DataProto.from_dict(merged)

    def _rows_by_teacher(self, batch: DataProto) -> dict[str, np.ndarray]:
        if self.routing_key not in batch.non_tensor_batch:
            raise KeyError(
                f"distillation.teacher_key={self.routing_key!r}: the batch has no such column (columns: "
                f"{sorted(batch.non_tensor_batch)}); several teachers route samples by it"
            )
        values = np.asarray([str(v) for v in batch.non_tensor_batch[self.routing_key]])
        unknown = sorted({str(v) for v in values} - set(self.groups))
        if unknown:
            raise ValueError(
                f"distillation.teacher_key={self.routing_key!r}: no teacher has the key {unknown[0]!r} "
                f"(teachers: {sorted(self.groups)}); set distillation.teacher_models.<name>.key"
            )
        rows = {key: np.flatnonzero(values == key) for key in self.groups}
        return {key: idx for key, idx in rows.items() if len(idx)}


def build_teacher_groups(
    config: Any, device: str, pools: list[RayResourcePool], tokenizer: Any
) -> dict[str, Any]:
    """``distillation.enabled``: each teacher on its share of the teachers' pool (the pools are
    appended to ``pools``), as ``teacher:<key>`` (:class:`verl.workers.teacher.TeacherWorker`);
    ``tokenizer``: the policy's tokenizer source, which a teacher shares."""
    from verl.workers.teacher import TeacherWorker, teacher_config

    distill = config.distillation
    if not distill.enabled:
        return {}
    topk = distill.distillation_loss.topk if distill.distillation_loss.uses_topk else None
    trainer, groups = config.trainer, {}
    for teacher in teacher_plan(distill):
        per_node = teacher_processes_per_node(teacher.processes, distill.nnodes, distill.n_gpus_per_node)
        pool = RayResourcePool(
            per_node,
            use_gpu=device == "cuda",
            name_prefix=f"teacher_pool_{teacher.key}",
            cpus_per_process=trainer.cpus_per_worker,
            size_key="distillation.n_gpus_per_node",
        )
        pools.append(pool)
        model = teacher_config(config.actor_rollout_ref, teacher.model_path)
        created = create_colocated_worker_groups(
            pool,
            {"teacher": RayClassWithInitArgs(TeacherWorker, model, topk=topk, tokenizer=tokenizer)},
            call_timeout_s=trainer.worker_call_timeout_s,
            setup_timeout_s=trainer.ray_wait_register_center_timeout,
        )
        groups[f"{GROUP_PREFIX}{teacher.key}"] = created["teacher"]
    return groups


def teacher_group_names(groups: dict[str, Any]) -> list[str]:
    return [name for name in groups if name.startswith(GROUP_PREFIX)]


def teacher_processes_per_node(processes: int, nnodes: int, per_node: int) -> list[int]:
    """A teacher's share of the teachers' pool as processes per node: whole nodes, or part of one."""
    if processes % per_node == 0:
        return [per_node] * (processes // per_node)
    if nnodes == 1:
        return [processes]
    raise ConfigError(
        f"distillation.teacher_models: a teacher of {processes} processes on {nnodes} nodes of {per_node}; "
        "with several nodes each teacher must fill whole nodes (num_replicas x replica size)"
    )
