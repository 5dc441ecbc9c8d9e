"""One rollout engine's memory lifecycle: asleep, weights awake, fully awake.

Colocated with training, an engine gives its device memory back between generations
(``rollout.free_cache_engine``; the hf rollout's ``rollout.offload_weights``) and takes it back in
two stages, as verl does in its hybrid engine: the weights first, so that new ones can be loaded
while the KV cache is still free for the trainer's leftovers, then the KV cache before anything
runs the model.

=====================  =================================  =========================================
state                  what the engine holds              allowed
=====================  =================================  =========================================
``ASLEEP``             nothing (weights offloaded)        sleep again (nothing happens)
``WEIGHTS_AWAKE``      its weights                        loading weights
``AWAKE``              its weights and KV cache           loading weights, generating, scoring
=====================  =================================  =========================================

:class:`EngineLifecycle` moves between them with each engine's documented calls, given by a
:class:`MemoryCalls`:

* vLLM (:class:`VLLMMemory`): ``LLM.sleep(level=1)`` (weights to host memory, KV cache freed),
  ``LLM.wake_up(tags=["weights"])`` then ``LLM.wake_up(tags=["kv_cache"])``, then
  ``LLM.reset_prefix_cache()``: the woken KV cache holds nothing the prefix cache may point to;
* SGLang (:class:`SGLangMemory`): ``Engine.release_memory_occupation(tags=["kv_cache", "weights"])``,
  ``Engine.resume_memory_occupation(tags=["weights"])`` then ``(tags=["kv_cache"])``, then
  ``Engine.flush_cache()``;
* the hf rollout (:class:`ModuleOffload`): the module moves to host memory and back; its KV cache
  lives only inside one generation, so waking it takes no call.

An engine that frees nothing (``frees_memory=False``: vLLM on CPU has no sleep mode, and
``free_cache_engine=False``) stays ``AWAKE`` and no call is made.
"""

from __future__ import annotations

import enum
import threading
from typing import Any, Protocol

import torch

WEIGHTS = "weights"
KV_CACHE = "kv_cache"


class EngineState(enum.IntEnum):
    ASLEEP = 0
    WEIGHTS_AWAKE = 1
    AWAKE = 2


class MemoryCalls(Protocol):
    """One engine's calls that free and take back its device memory."""

    def release(self) -> None:
        """Free the weights and the KV cache of a fully awake engine."""

    def resume(self, tag: str) -> None:
        """Take back the memory of ``tag`` (:data:`WEIGHTS`, then :data:`KV_CACHE`)."""

    def drop_cache(self) -> None:
        """Forget the cached prefixes: the KV cache just woke and holds none of them."""


class VLLMMemory:
    """``vllm.LLM``'s sleep mode (the engine must be built with ``enable_sleep_mode``). Level 1
    keeps the weights in host memory: a wake without a weight update (validation, a LoRA policy
    whose base weights the engine loaded itself) runs the same model."""

    def __init__(self, llm: Any, level: int = 1) -> None:
        self.llm = llm
        self.level = level

    def release(self) -> None:
        self.llm.sleep(level=self.level)

    def resume(self, tag: str) -> None:
        self.llm.wake_up(tags=[tag])

    def drop_cache(self) -> None:
        self.llm.reset_prefix_cache()


class SGLangMemory:
    """``sglang.Engine``'s memory saver (built with ``enable_memory_saver``). The tags are named on
    release too: SGLang's default releases more (e.g. CUDA graphs) than the two resumes take back."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def release(self) -> None:
        self.engine.release_memory_occupation(tags=[KV_CACHE, WEIGHTS])

    def resume(self, tag: str) -> None:
        self.engine.resume_memory_occupation(tags=[tag])

    def drop_cache(self) -> None:
        self.engine.flush_cache()


class ModuleOffload:
    """A torch module's weights moved to host memory and back to ``device``."""

    def __init__(self, module: torch.nn.Module, device: torch.device) -> None:
        self.module = module
        self.device = device

    def release(self) -> None:
        self.module.to("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def resume(self, tag: str) -> None:
        if tag == WEIGHTS:
            self.module.to(self.device)

    def drop_cache(self) -> None:
        """Nothing is cached between two generations."""


class EngineLifecycle:
    """The state of one engine and the transitions of the module doc string; each transition makes
    the engine's calls once, in order, and none where the engine is already there."""

    def __init__(self, calls: MemoryCalls, frees_memory: bool) -> None:
        self.calls = calls
        self.frees_memory = frees_memory
        self.state = EngineState.AWAKE
        self._lock = threading.RLock()  # a transition is never seen half done

    def sleep(self) -> None:
        """Free the engine's memory. From a partial wake the KV cache wakes first: the engines
        release from a full wake (SGLang refuses to release a tag twice)."""
        with self._lock:
            if not self.frees_memory or self.state == EngineState.ASLEEP:
                return
            if self.state == EngineState.WEIGHTS_AWAKE:
                self.wake_up()
            self.calls.release()
            self.state = EngineState.ASLEEP

    def wake_weights(self) -> None:
        """Take the weights back, and only them (what a weight update needs)."""
        with self._lock:
            if self.state == EngineState.ASLEEP:
                self.calls.resume(WEIGHTS)
                self.state = EngineState.WEIGHTS_AWAKE

    def wake_up(self) -> None:
        """Take everything back (what generating and scoring need)."""
        with self._lock:
            self.wake_weights()
            if self.state == EngineState.WEIGHTS_AWAKE:
                self.calls.resume(KV_CACHE)
                self.calls.drop_cache()
                self.state = EngineState.AWAKE
