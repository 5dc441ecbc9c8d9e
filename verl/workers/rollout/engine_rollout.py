"""What the rollouts over an external inference engine (vLLM, SGLang) share.

The engine holds its own copy of the weights, generates from unpadded prompt ids and returns token
ids (and their log-probs); this base keeps the state every such backend needs (sampling settings,
the weight version, whether the engine is asleep, one lock around engine calls) and turns the
engine's outputs into the rollout batch. A subclass builds its engine and implements the calls.

The engine's memory follows its :class:`~verl.workers.rollout.lifecycle.EngineLifecycle`, whoever
makes the calls (the colocated worker, the rollout server, the async trainer): a subclass's
``update_weights`` (and ``weight_fingerprint``) first calls ``self.lifecycle.wake_weights()``, its
``generate_sequences`` and ``sequence_log_probs`` ``self.lifecycle.wake_up()``, each under the
engine lock; ``sleep()`` frees the memory again.
"""

from __future__ import annotations

import os
import threading
from functools import cached_property
from typing import Any

import torch

from verl.config.rollout import RolloutConfig
from verl.config.rollout_backends import rollout_backend
from verl.protocol import DataProto
from verl.workers.engine.lora import uses_lora
from verl.workers.rollout.base import Rollout, assemble_responses
from verl.workers.rollout.lifecycle import EngineLifecycle, MemoryCalls
from verl.workers.rollout.sampling import SamplingParams


def engine_model_dir(config: RolloutConfig, model_config: Any) -> str:
    """The Hugging Face model folder an engine loads by itself (it cannot read a GGUF file)."""
    if model_config.gguf_file:
        raise ValueError(
            f"actor_rollout_ref.model.gguf_file: the {config.name} rollout loads a Hugging Face model "
            "directory; convert the GGUF file once (python -m verl.utils.smollm --target_dir DIR) and "
            "pass that DIR"
        )
    return os.path.expanduser(model_config.path)


def syncs_lora_adapter(config: RolloutConfig, model_config: Any) -> bool:
    """Whether weight updates carry the LoRA adapter alone: a LoRA policy with a rollout whose engine
    serves adapters (vLLM) on base weights it loads itself. With a ``dummy`` ``load_format`` the
    engine has no base weights, so it gets merged weights, as the other backends always do."""
    return (
        uses_lora(model_config)
        and rollout_backend(config.name).serves_lora_adapters
        and not config.load_format.startswith("dummy")
    )


def user_engine_kwargs(config: RolloutConfig, engine: str) -> dict[str, Any]:
    """``rollout.engine_kwargs.<engine>`` (``vllm``, ``sglang``), which the rollout passes to the
    engine's constructor as given, over the arguments it derives from the rollout keys. A null value
    is dropped, so the derived argument or the engine's own default stays (verl drops nulls for
    vLLM too)."""
    given = config.engine_kwargs.get(engine) or {}
    return {key: value for key, value in given.items() if value is not None}


def prompt_token_ids(prompts: DataProto) -> list[list[int]]:
    """Each row's prompt ids without its left padding (what an engine takes)."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    return [row[m].tolist() for row, m in zip(ids, mask)]


class EngineRollout(Rollout):
    def __init__(
        self,
        config: RolloutConfig,
        pad_token_id: int,
        eos_token_ids: list[int],
        device: torch.device,
        seed: int,
    ) -> None:
        self.config = config
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.device = device
        self.seed = seed
        self.version = 0
        # one engine call at a time: a weight update arriving from another thread (the async
        # trainer publishes while a generation runs) waits for the generation to finish
        self._engine_lock = threading.Lock()

    # ------------------------------------------------------------------ memory
    def frees_memory_when_asleep(self) -> bool:
        """Whether :meth:`sleep` releases the engine's memory (``rollout.free_cache_engine``)."""
        return self.config.free_cache_engine

    def memory_calls(self) -> MemoryCalls:
        """The engine's calls that free and take back its memory."""
        raise NotImplementedError

    @cached_property
    def lifecycle(self) -> EngineLifecycle:
        """Built on first use: the subclass builds its engine after this base's ``__init__``."""
        return EngineLifecycle(self.memory_calls(), self.frees_memory_when_asleep())

    def sleep(self) -> None:
        with self._engine_lock:
            self.lifecycle.sleep()

    def wake_up(self) -> None:
        with self._engine_lock:
            self.lifecycle.wake_up()

    # ------------------------------------------------------------------ outputs
    def assemble(
        self,
        prompts: DataProto,
        rows: list[tuple[list[int], list[float]]],
        params: SamplingParams,
        with_log_probs: bool,
        version: int,
    ) -> DataProto:
        """The rollout batch from each row's generated ids and log-probs (made by ``version``)."""
        eos = self.eos_token_ids if not params.ignore_eos else [-1]
        return assemble_responses(
            prompts, rows, params.response_length, self.pad_token_id, eos, version, with_log_probs
        )
