"""Rollout backends behind one interface (:class:`verl.workers.rollout.base.Rollout`).

``rollout.name`` picks a backend from the registry (:mod:`verl.config.rollout_backends`); its
classes are imported here, when a worker builds one (the engines are optional dependencies).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from verl.config.rollout import RolloutConfig
from verl.config.rollout_backends import rollout_backend
from verl.utils.model import import_external_lib
from verl.workers.rollout.base import Rollout, WeightSyncError, engine_dtype, verify_weight_sync
from verl.workers.rollout.engine_rollout import syncs_lora_adapter


def _load(target: str) -> Any:
    """The object that ``"module:name"`` names."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def build_rollout(
    config: RolloutConfig, model_config: Any, tokenizer: Any, device: torch.device, seed: int
) -> Rollout:
    """The backend named by ``rollout.name`` for the model of ``model_config``. ``model.external_lib``
    is imported first: a plugin may register the backend."""
    import_external_lib(model_config.external_lib)
    return _load(rollout_backend(config.name).rollout).create(config, model_config, tokenizer, device, seed)


def build_server(rollout: Rollout, config: RolloutConfig, tokenizer: Any, model_name: str):
    """Server mode (``rollout.mode=async``): the engine of ``rollout`` driven by a
    :class:`~verl.workers.rollout.server.RolloutServer` (continuous batching, weight updates
    between two steps) behind an OpenAI-compatible HTTP front on loopback."""
    from verl.workers.rollout.http_front import HTTPFront
    from verl.workers.rollout.server import RolloutServer

    engine = _load(rollout_backend(config.name).step_engine).create(rollout, config)
    server = RolloutServer(engine)
    return server, HTTPFront(server, tokenizer, config, model_name, config.server.timeout_s)


__all__ = [
    "Rollout",
    "WeightSyncError",
    "build_rollout",
    "build_server",
    "engine_dtype",
    "syncs_lora_adapter",
    "verify_weight_sync",
]
