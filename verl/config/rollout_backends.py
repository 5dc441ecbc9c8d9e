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

from verl.config.base import ConfigError, check


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
    tensor_parallel: bool = False
    """One engine spans ``rollout.tensor_model_parallel_size`` consecutive ranks
    (:mod:`verl.workers.rollout.tp_group`); else each rank runs its own engine."""


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


VERL_ONLY_ROLLOUTS = {"trtllm": "TensorRT-LLM"}
"""verl's values of ``rollout.name`` that no backend here serves: they resolve (``--cfg job``) and
are refused when a run starts (:func:`refuse_rollout_backend`)."""


def check_rollout_name(name: str, key: str) -> None:
    """``name`` is a registered backend or one of verl's that is refused at start-up."""
    check(
        name in ROLLOUT_BACKENDS or name in VERL_ONLY_ROLLOUTS,
        key,
        f"one of {sorted(ROLLOUT_BACKENDS)}",
        name,
    )


def tensor_parallel_size(config: Any) -> int:
    """Ranks per engine: ``rollout.tensor_model_parallel_size`` for a backend whose engines span
    ranks (and verl's engines that are not here), 1 for one that runs an engine per rank (the key is
    inert there, e.g. ``hf``)."""
    backend = ROLLOUT_BACKENDS.get(config.name)
    return config.tensor_model_parallel_size if backend is None or backend.tensor_parallel else 1


def refuse_rollout_backend(config: Any) -> None:
    """At start-up: the rollout's engine is one this project has (:data:`VERL_ONLY_ROLLOUTS` are not),
    and its backend's own checks (SGLang's tensor-parallel engines)."""
    rollout, key = config.actor_rollout_ref.rollout, "actor_rollout_ref.rollout"
    if rollout.name in VERL_ONLY_ROLLOUTS:
        raise ConfigError(
            f"{key}.name={rollout.name!r}: the {VERL_ONLY_ROLLOUTS[rollout.name]} rollout engine is not "
            f"implemented here; use one of {sorted(ROLLOUT_BACKENDS)}"
        )
    backend = rollout_backend(rollout.name)
    if backend.check is not None:
        backend.check(rollout, key)


def check_tensor_parallel_model(size: int, hf_config: Any) -> None:
    """The model splits over ``size`` ranks: its query heads evenly, its key/value heads evenly or
    replicated (``size`` a multiple of their count), as vLLM shards attention."""
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    heads = hf_config.num_attention_heads
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    check(heads % size == 0, key, f"a divisor of the model's {heads} attention heads", size)
    check(
        kv % size == 0 or size % kv == 0,
        key,
        f"a divisor or a multiple of the model's {kv} key/value heads",
        size,
    )


def sglang_one_engine_per_rank(config: Any, path: str) -> None:
    """SGLang runs one engine per rank: its tensor-parallel path has no CPU build to be tested on."""
    check(
        config.tensor_model_parallel_size == 1,
        f"{path}.tensor_model_parallel_size",
        "1 with rollout.name=sglang (each rank runs its own engine; tensor-parallel SGLang engines are "
        "not wired: SGLang has no CPU build to test them on. rollout.name=vllm runs tensor-parallel "
        "engines)",
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
        keeps_state_in_worker=False,
        serves_lora_adapters=True,
        tensor_parallel=True,
    )
)
register_rollout_backend(
    RolloutBackend(
        "sglang",
        "verl.workers.rollout.sglang_rollout:SGLangRollout",
        "verl.workers.rollout.sglang_engine:SGLangStepEngine",
        check=sglang_one_engine_per_rank,
        keeps_state_in_worker=False,
    )
)
