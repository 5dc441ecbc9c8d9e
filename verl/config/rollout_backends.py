"""The rollout backends (``actor_rollout_ref.rollout.name``): one registry entry each.

An entry names the backend's classes by import path (``"module:Class"``), so the config can list
and check the backends without importing an engine: the workers import the class when they build
it (:func:`verl.workers.rollout.build_rollout`). Adding a backend is one new file with its
:class:`~verl.workers.rollout.base.Rollout` (and, for server mode, its step engine) plus one
:func:`register_rollout_backend` line below, or in a plugin module loaded with
``actor_rollout_ref.model.external_lib`` (imported by the driver and by every worker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.config.base import check


@dataclass(frozen=True)
class RolloutBackend:
    name: str
    """The value of ``rollout.name`` that selects it."""
    rollout: str
    """``"module:Class"`` of its ``Rollout``; the class builds itself with
    ``create(config, model_config, tokenizer, device, seed)``."""
    step_engine: str
    """``"module:Class"`` of its server-mode step engine, built with ``create(rollout, config)``."""
    check: Callable[[Any, str], None] | None = None
    """Extra checks of the rollout section for this backend: ``check(rollout_config, path)``."""
    keeps_state_in_worker: bool = True
    """False when the engine leaves state outside the worker object (threads, child processes,
    device memory pools), so the worker's process cannot be reused by the next run."""
    serves_lora_adapters: bool = False
    """The engine takes a LoRA adapter on top of base weights it loaded itself."""


ROLLOUT_BACKENDS: dict[str, RolloutBackend] = {}


def register_rollout_backend(backend: RolloutBackend) -> RolloutBackend:
    """Add ``backend`` under its name; a name registered twice is an error."""
    if backend.name in ROLLOUT_BACKENDS and ROLLOUT_BACKENDS[backend.name] != backend:
        raise ValueError(f"a rollout backend named {backend.name!r} is already registered")
    ROLLOUT_BACKENDS[backend.name] = backend
    return backend


def rollout_backend(name: str) -> RolloutBackend:
    check(
        name in ROLLOUT_BACKENDS, "actor_rollout_ref.rollout.name", f"one of {sorted(ROLLOUT_BACKENDS)}", name
    )
    return ROLLOUT_BACKENDS[name]


def one_engine_per_rank(config: Any, path: str) -> None:
    """Each rank runs its own engine: tensor-parallel engines are not supported yet."""
    check(
        config.tensor_model_parallel_size == 1,
        f"{path}.tensor_model_parallel_size",
        f"1 with rollout.name={config.name} (each rank runs its own engine; tensor-parallel engines are "
        "not supported yet)",
        config.tensor_model_parallel_size,
    )


register_rollout_backend(
    RolloutBackend(
        "hf", "verl.workers.rollout.hf_rollout:HFRollout", "verl.workers.rollout.hf_engine:HFStepEngine"
    )
)
register_rollout_backend(
    RolloutBackend(
        "vllm",
        "verl.workers.rollout.vllm_rollout:VLLMRollout",
        "verl.workers.rollout.vllm_engine:VLLMStepEngine",
        check=one_engine_per_rank,
        keeps_state_in_worker=False,
        serves_lora_adapters=True,
    )
)
register_rollout_backend(
    RolloutBackend(
        "sglang",
        "verl.workers.rollout.sglang_rollout:SGLangRollout",
        "verl.workers.rollout.sglang_engine:SGLangStepEngine",
        check=one_engine_per_rank,
        keeps_state_in_worker=False,
    )
)
