"""The ``hf`` rollout: batched generation with a KV cache on an in-process transformers model.

The CPU default, and the reference implementation of :class:`Rollout`. It holds its own
copy of the policy (weights synced from the actor after every update), samples with its
own seeded ``torch.Generator`` (saved in checkpoints; reseeded by a request whose
``meta_info`` carries ``sampling_seed``, which the trainers set to the step, so a replayed
step samples the same tokens), and can take a weight update between two decoding steps:
the KV cache is then rebuilt under the new weights and the remaining tokens carry the new
version.

With ``rollout.calculate_log_probs`` (needed for off-policy correction), ``rollout_log_probs``
are recomputed after generation by one teacher-forced forward pass with the trainer's own
function (:func:`verl.workers.forward.response_log_probs`), so they equal the trainer's
log-probs on CPU in fp32 to rounding: within 1e-5, bit for bit on some CPUs (the LM head's
product can take another GEMM kernel, since this copy's weights do not require grad). The
log-probs seen while decoding differ from them by float rounding of the cached attention; that gap
is reported as ``rollout/decode_logprob_diff_max``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache

from verl.config.rollout import RolloutConfig
from verl.protocol import DataProto
from verl.utils.metric import reduce_metrics
from verl.utils.model import eos_token_ids, load_causal_lm
from verl.utils.mrope import model_position_ids
from verl.workers.engine.micro_batch import split_micro_batches
from verl.workers.forward import (
    POLICY_INPUT_KEYS,
    drop_common_left_padding,
    response_log_probs,
    takes_logits_to_keep,
    whole_sequence_batch,
)
from verl.workers.rollout.base import Rollout, engine_dtype, response_tensors
from verl.workers.rollout.lifecycle import EngineLifecycle, ModuleOffload
from verl.workers.rollout.probe import FingerprintSpec, module_fingerprint
from verl.workers.rollout.sampling import SamplingParams, derived_seed, sample_tokens
from verl.workers.vision import MULTI_MODAL_INPUTS, micro_batch_vision, placeholder_token_ids


@dataclass
class _Decoded:
    responses: torch.Tensor
    decode_log_probs: torch.Tensor
    versions: torch.Tensor


class HFRollout(Rollout):
    @classmethod
    def create(
        cls, config: RolloutConfig, model_config: Any, tokenizer: Any, device: torch.device, seed: int
    ) -> HFRollout:
        """The rollout over its own copy of the policy, loaded in ``rollout.dtype`` where that applies."""
        dtype = getattr(torch, engine_dtype(config, device.type))
        module = load_causal_lm(model_config, dtype=dtype)
        return cls(
            module, config, tokenizer.pad_token_id, eos_token_ids(tokenizer, model_config.path), device, seed
        )

    def __init__(
        self,
        module: nn.Module,
        config: RolloutConfig,
        pad_token_id: int,
        eos_token_ids: list[int],
        device: torch.device,
        seed: int,
    ) -> None:
        self.module = module.to(device).eval()
        self.module.requires_grad_(False)
        self.config = config
        self.pad_token_id = pad_token_id
        self.eos_token_ids = torch.tensor(eos_token_ids, device=device)
        self.device = device
        self.seed = seed
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.placeholder_ids = torch.tensor(
            placeholder_token_ids(getattr(module, "config", None)), dtype=torch.long, device=device
        )
        self.version = 0
        self._lock = threading.Lock()
        self._generate_lock = threading.Lock()
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None
        # rollout.offload_weights: the module lives in host memory between generations (on CUDA)
        offloads = device.type == "cuda" and config.offload_weights
        self.lifecycle = EngineLifecycle(ModuleOffload(self.module, device), frees_memory=offloads)

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Stage the new weights; they are swapped in between decoding steps (or right now if idle)."""
        staged = {name: t.detach().to(self.device, copy=True) for name, t in named_tensors}
        with self._lock:
            self._pending = (staged, version)
        # Idle: swap now. Generating (the lock is held): the decode loop swaps them in between
        # two steps. Testing a flag instead would race with a generation starting meanwhile.
        if self._generate_lock.acquire(blocking=False):
            try:
                self._apply_pending()
            finally:
                self._generate_lock.release()

    def _apply_pending(self) -> bool:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return False
        state, version = pending
        self.lifecycle.wake_weights()  # loaded where the module computes, not into its offloaded copy
        own = self.module.state_dict()
        missing = [k for k in own if k not in state]
        if missing:
            raise KeyError(f"weight update is missing {len(missing)} tensors, e.g. {missing[:3]}")
        with torch.no_grad():
            for name, tensor in own.items():
                tensor.copy_(state[name])
        self.version = version
        return True

    def weight_fingerprint(self, spec: FingerprintSpec) -> dict[str, int | None]:
        """Its parameters are what it computes with (see :mod:`~verl.workers.rollout.probe`)."""
        return module_fingerprint(self.module, spec)

    def state_dict(self) -> dict:
        return {"version": self.version, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]
        self.generator.set_state(state["generator"])

    # ------------------------------------------------------------------ generation
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        # one generation at a time (e.g. validation and an async rollout in two threads);
        # weight updates never wait for it
        with self._generate_lock:
            self.lifecycle.wake_up()
            return self._generate_sequences(prompts)

    def _generate_sequences(self, prompts: DataProto) -> DataProto:
        params = SamplingParams.resolve(self.config, prompts.meta_info)
        if "sampling_seed" in prompts.meta_info:  # rank-specific, then request-specific
            self.generator.manual_seed(derived_seed(prompts.meta_info["sampling_seed"], self.seed))
        chunks = prompts.split(max(1, self.config.max_num_seqs))
        outputs = [self._generate_chunk(chunk, params) for chunk in chunks]
        out = DataProto.concat(outputs)  # the chunks' metrics gathered into lists, reduced here
        out.meta_info = {"metrics": reduce_metrics(out.meta_info["metrics"])}
        return out

    @torch.no_grad()
    def _generate_chunk(self, prompts: DataProto, params: SamplingParams) -> DataProto:
        prompt_ids = prompts.batch["input_ids"].to(self.device)
        prompt_mask = prompts.batch["attention_mask"].to(self.device)
        prompt_pos = prompts.batch["position_ids"].to(self.device)
        images = prompts.non_tensor_batch.get(MULTI_MODAL_INPUTS)  # a vision-language model's rows
        vision = {
            k: v.to(self.device) for k, v in micro_batch_vision(images if images is not None else []).items()
        }
        self._apply_pending()
        decoded = self._decode(*drop_common_left_padding(prompt_ids, prompt_mask, prompt_pos), params, vision)
        return self._assemble(prompt_ids, prompt_mask, prompt_pos, decoded, params, images)

    def _prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        vision: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, DynamicCache]:
        cache = DynamicCache()
        # only the last position's logits are sampled from: the LM head skips the others (a
        # [rows, prompt, vocabulary] tensor otherwise) when the model's forward allows it. Given as
        # an index, not as 1: the gathered hidden states are contiguous, whereas a strided slice can
        # send the head's matmul to a batched product over a copy of the weight per row.
        last = (
            {"logits_to_keep": torch.tensor([ids.shape[1] - 1], device=ids.device)}
            if takes_logits_to_keep(self.module)
            else {}
        )
        out = self.module(
            input_ids=ids,
            attention_mask=mask,
            position_ids=model_position_ids(pos),
            past_key_values=cache,
            use_cache=True,
            **(vision or {}),
            **last,
        )
        return out.logits[:, -1].float(), cache

    def _decode(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        pos: torch.Tensor,
        params: SamplingParams,
        vision: dict[str, torch.Tensor],
    ) -> _Decoded:
        batch, length = ids.shape[0], params.response_length
        responses = torch.full((batch, length), self.pad_token_id, dtype=ids.dtype, device=self.device)
        log_probs = torch.zeros(batch, length, device=self.device)
        versions = torch.full((batch, length), -1, dtype=torch.long, device=self.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        logits, cache = self._prefill(ids, mask, pos, vision)
        next_pos = pos[..., -1:] + 1  # [B, 1], or [B, 3, 1] under M-RoPE
        # Asking "all finished?" waits for the GPU, which then idles while Python launches the
        # next step; on CUDA ask every 8 steps (finished rows only emit padding meanwhile).
        check_every = 8 if self.device.type == "cuda" else 1
        for t in range(length):
            if self._apply_pending():  # new weights landed: rebuild the cache under them
                all_ids = torch.cat([ids, responses[:, :t]], dim=1)
                all_pos = torch.cat([pos, next_pos + torch.arange(t, device=self.device) - t], dim=-1)
                logits, cache = self._prefill(all_ids, mask, all_pos, vision)
            logits[:, self.placeholder_ids] = float("-inf")  # an image token without its image: never sampled
            token, token_lp = sample_tokens(logits, params, self.generator)
            token = torch.where(finished, self.pad_token_id, token)
            responses[:, t], log_probs[:, t], versions[:, t] = token, token_lp, self.version
            if not params.ignore_eos:
                finished = finished | torch.isin(token, self.eos_token_ids)
            if t == length - 1 or (t % check_every == check_every - 1 and bool(finished.all())):
                break
            # Finished rows keep attending (their outputs are discarded): a mask with holes
            # would push SDPA off its fast kernels for the whole batch.
            mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
            out = self.module(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=model_position_ids(next_pos),
                past_key_values=cache,
                use_cache=True,
            )
            logits, next_pos = out.logits[:, -1].float(), next_pos + 1
        return _Decoded(responses, log_probs, versions)

    def _assemble(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        prompt_pos: torch.Tensor,
        decoded: _Decoded,
        params: SamplingParams,
        images: np.ndarray | None,
    ) -> DataProto:
        eos = self.eos_token_ids.tolist() if not params.ignore_eos else [-1]
        tensors = response_tensors(
            prompt_ids, prompt_mask, prompt_pos, decoded.responses, decoded.versions, eos
        )
        tensors = {k: v.cpu() for k, v in tensors.items()}
        response_mask = tensors["response_mask"]
        metrics: dict[str, float] = {}
        if self.config.calculate_log_probs and not params.validate:
            recomputed = self._recompute_log_probs(tensors, params.temperature, images)
            mask = response_mask.bool()
            gap = (recomputed - decoded.decode_log_probs.cpu()).abs()[mask]
            metrics["rollout/decode_logprob_diff_max"] = float(gap.max()) if gap.numel() else 0.0
            tensors["rollout_log_probs"] = recomputed
        return DataProto.from_dict(tensors, meta_info={"metrics": metrics})

    def _recompute_log_probs(
        self, tensors: dict[str, torch.Tensor], temperature: float, images: np.ndarray | None
    ) -> torch.Tensor:
        columns = {MULTI_MODAL_INPUTS: images} if images is not None else None  # each row's pictures
        data = DataProto.from_dict({k: tensors[k] for k in POLICY_INPUT_KEYS}, non_tensors=columns)
        micro_batches, _ = split_micro_batches(
            data, POLICY_INPUT_KEYS, self.config.log_prob_micro_batch_size_per_gpu
        )
        outs = []
        for micro in micro_batches:
            micro = {k: v.to(self.device) for k, v in micro.items()}
            outs.append(response_log_probs(self.module, micro, temperature)["log_probs"].float().cpu())
        return torch.cat(outs, dim=0)

    @torch.no_grad()
    def sequence_log_probs(self, token_ids: list[int]) -> torch.Tensor:
        micro = {k: v.to(self.device) for k, v in whole_sequence_batch(token_ids).items()}
        with self._generate_lock:  # not while a generation has half-applied weights
            self.lifecycle.wake_up()
            self._apply_pending()
            return response_log_probs(self.module, micro, 1.0)["log_probs"][0].float().cpu()

    def sleep(self) -> None:
        with self._generate_lock:  # not under a generation in another thread
            self.lifecycle.sleep()

    def wake_up(self) -> None:
        self.lifecycle.wake_up()
