"""Stand-ins for the rollout engines, strict where the real ones are on a GPU (see
:mod:`tests.workers.rollout.test_engine_lifecycle`): each refuses what its engine refuses in sleep
mode, and records the calls it was asked, in order."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from verl.workers.rollout.lifecycle import KV_CACHE, WEIGHTS, VLLMMemory
from verl.workers.rollout.server import StepEngine

EOS = 2


class EngineRefused(AssertionError):
    """What a stand-in raises where the real engine would fail (or hang) on a GPU."""


class StrictLLM:
    """``vllm.LLM`` with ``enable_sleep_mode``: the calls the vllm rollout makes, with vLLM's
    preconditions. Its "model" is one weight ``w``; every log-prob it reports is ``-w``."""

    def __init__(self) -> None:
        self.asleep: set[str] = set()  # vLLM's sleeping tags
        self.weights = {"w": torch.tensor([1.0])}
        self.calls: list[str] = []

    def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep({level})")
        if self.asleep:
            raise EngineRefused(f"sleep on a sleeping engine (asleep: {sorted(self.asleep)})")
        self.asleep = {WEIGHTS, KV_CACHE}

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(f"wake_up({','.join(tags or ['all'])})")
        wanted = set(tags or self.asleep)
        if not wanted or not wanted <= self.asleep:
            raise EngineRefused(f"wake_up({tags}) of what is awake (asleep: {sorted(self.asleep)})")
        self.asleep -= wanted
        return not self.asleep

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset_prefix_cache")  # bookkeeping only: allowed in any state
        return True

    def collective_rpc(self, method, kwargs: dict | None = None, args: tuple = ()):
        if WEIGHTS in self.asleep:
            raise EngineRefused(f"collective_rpc({method}) while the weights are offloaded")
        if method == "reload_weights":
            self.calls.append("reload_weights")
            for name, tensor in kwargs["weights_iterator"]:
                self.weights[name] = tensor.clone()
            return [None]
        if getattr(method, "__name__", None) == "repack_cpu_experts":  # after a reload on CPU: no MoE here
            self.calls.append("repack_cpu_experts")
            return [0]
        self.calls.append("read_weights")
        return [{}]  # e.g. the weight fingerprint: nothing this stand-in can hash

    def generate(self, prompts: list, sampling, use_tqdm: bool = False, lora_request=None) -> list:
        self.calls.append("generate")
        if self.asleep:
            raise EngineRefused(f"generate while {sorted(self.asleep)} sleep (the scheduler is paused)")
        lp = -float(self.weights["w"][0])
        outputs = []
        for prompt in prompts:
            ids = prompt["prompt_token_ids"]
            tokens = [7, EOS]
            completion = SimpleNamespace(
                token_ids=tokens, logprobs=[{t: SimpleNamespace(logprob=lp)} for t in tokens]
            )
            scored = [None] + [{t: SimpleNamespace(logprob=lp)} for t in ids[1:]]
            outputs.append(SimpleNamespace(outputs=[completion], prompt_logprobs=scored))
        return outputs


class StrictSGLang:
    """``sglang.Engine`` with ``enable_memory_saver``: its memory calls and ``generate``."""

    def __init__(self) -> None:
        self.released: set[str] = set()
        self.calls: list[str] = []

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"release({','.join(tags or ['all'])})")
        if tags is None or self.released & set(tags):
            raise EngineRefused(f"release of {tags} (released: {sorted(self.released)})")
        self.released |= set(tags)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"resume({','.join(tags or ['all'])})")
        if tags is None or not set(tags) <= self.released:
            raise EngineRefused(f"resume of {tags} (released: {sorted(self.released)})")
        self.released -= set(tags)

    def flush_cache(self) -> None:
        self.calls.append("flush_cache")

    def generate(self, input_ids, sampling_params, return_logprob=False, logprob_start_len=None):
        self.calls.append("generate")
        if self.released:
            raise EngineRefused(f"generate while {sorted(self.released)} are released")
        return {
            "meta_info": {
                "input_token_logprobs": [(None, input_ids[0], None)]
                + [(-1.0, t, None) for t in input_ids[1:]]
            }
        }


class StandInOffload:
    """The hf rollout's module offload, simulated on CPU: the parameters' storage is kept aside and
    each parameter left empty, so that loading into the module or running it fails loudly."""

    def __init__(self, module: torch.nn.Module, events: list[str]) -> None:
        self.module = module
        self.events = events
        self.kept: dict[str, torch.Tensor] = {}
        module.register_forward_pre_hook(lambda *_: self._log("forward"))

    def _log(self, event: str) -> None:
        if not self.events or self.events[-1] != event:  # a run of forwards is one event
            self.events.append(event)

    def release(self) -> None:
        self._log("release")
        for name, param in self.module.named_parameters():
            self.kept[name] = param.data
            param.data = torch.empty(0, dtype=param.dtype)

    def resume(self, tag: str) -> None:
        self._log(f"resume({tag})")
        if tag == WEIGHTS:
            for name, param in self.module.named_parameters():
                param.data = self.kept.pop(name)

    def drop_cache(self) -> None:
        self._log("drop_cache")


class RecordingCalls:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def release(self) -> None:
        self.calls.append("release")

    def resume(self, tag: str) -> None:
        self.calls.append(f"resume({tag})")

    def drop_cache(self) -> None:
        self.calls.append("drop_cache")


class IdleStepEngine(StepEngine):
    """Server mode without requests: what an update between two steps goes through."""

    def __init__(self, rollout, log: list[str]) -> None:
        self.rollout, self.log = rollout, log

    def add(self, request) -> None:
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        pass

    def has_work(self) -> bool:
        return False

    def step(self) -> list:
        return []

    def weights_changed(self) -> None:
        self.log.append("weights_changed")


class WatchedVLLMMemory(VLLMMemory):
    """vLLM's calls, each followed by what the engine says of itself (``is_sleeping``)."""

    def __init__(self, llm) -> None:
        super().__init__(llm)
        self.log: list[tuple[str, object, bool]] = []

    def release(self) -> None:
        super().release()
        self.log.append(("sleep", None, self.llm.llm_engine.is_sleeping()))

    def resume(self, tag: str) -> None:
        fully_awake = self.llm.wake_up(tags=[tag])
        self.log.append((f"wake_up({tag})", fully_awake, self.llm.llm_engine.is_sleeping()))

    def drop_cache(self) -> None:
        self.log.append(
            ("reset_prefix_cache", self.llm.reset_prefix_cache(), self.llm.llm_engine.is_sleeping())
        )
