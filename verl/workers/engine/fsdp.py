"""The torch training engine: plain torch on one CPU rank, FSDP2 (``fully_shard``) otherwise.

* CPU: fp32 everywhere (unless ``fsdp_config.model_dtype`` says otherwise); several ranks shard
  over gloo. ``mixed_precision.cpu_autocast`` computes forward and backward in
  ``mixed_precision.param_dtype`` under ``torch.autocast`` (the weights stay as they are).
* CUDA: fp32 master weights (or ``model_dtype``); compute, gradient reduction and buffers in
  ``fsdp_config.mixed_precision``'s dtypes (by default bf16, fp32, fp32, as in verl).
  ``fsdp_config.param_offload`` keeps the weights in host memory between calls (loaded for each
  forward pass, update or weight sync), ``optimizer_offload`` the optimizer state between updates.

Checkpoints use ``torch.distributed.checkpoint`` (DCP): every rank writes its shard. Resuming
needs the same number of ranks: the driver refuses a checkpoint written by another count (the
LR-schedule and RNG files are per rank). To continue on another layout, export the weights with
``python -m verl.model_merger merge`` and start a new run from them. A truncated or corrupt shard
is an error that names the file and the previous step to resume from.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from verl.config.engine import MODEL_DTYPES, FSDPConfig, OptimConfig
from verl.utils.checkpoint.sharded import load_sharded, save_sharded
from verl.utils.fsdp_utils import move_optimizer_state
from verl.workers.engine.base import ForwardFn, LossFn, MicroBatch, TrainEngine
from verl.workers.engine.lora import (
    ADAPTER,
    adapter_items,
    is_lora,
    is_trained,
    lora_scaling,
    merged_state_dict,
)
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer

logger = logging.getLogger(__name__)


def torch_dtype(name: str) -> torch.dtype:
    """``fp32`` / ``bf16`` / ``fp16`` (or the torch spellings) -> the torch dtype."""
    return getattr(torch, MODEL_DTYPES[name])


def mixed_precision_policy(fsdp: FSDPConfig, device_type: str) -> MixedPrecisionPolicy | None:
    """FSDP2's compute and gradient-reduction dtypes (``fsdp_config.mixed_precision``), on GPU only:
    on CPU the forward runs in the weights' own dtype."""
    if device_type != "cuda":
        return None
    mp = fsdp.mixed_precision
    return MixedPrecisionPolicy(
        param_dtype=torch_dtype(mp.param_dtype), reduce_dtype=torch_dtype(mp.reduce_dtype)
    )


def cast_float_buffers(module: nn.Module, dtype: torch.dtype) -> None:
    """Hold the floating-point buffers (e.g. rotary ``inv_freq``) in ``dtype``: FSDP2 leaves buffers
    alone, so ``mixed_precision.buffer_dtype`` is applied here, as FSDP1's ``buffer_dtype`` would."""
    for sub in module.modules():
        for name, buffer in sub.named_buffers(recurse=False):
            if buffer.is_floating_point():
                sub._buffers[name] = buffer.to(dtype)


def apply_fsdp2(module: nn.Module, device_type: str, fsdp: FSDPConfig, trains: bool = False) -> nn.Module:
    """Shard each transformer block (the model's ``_no_split_modules``), then the root.

    A trained module on a single rank keeps its gathered parameters from forward to backward
    (``reshard_after_forward`` off): one rank holds every shard anyway, and the second gather
    and cast in backward cost 13% of an H100 update of a 0.5B model; backward reshards as usual."""
    mp = mixed_precision_policy(fsdp, device_type)
    if mp is not None:
        cast_float_buffers(module, torch_dtype(fsdp.mixed_precision.buffer_dtype))
    single_rank = not dist.is_initialized() or dist.get_world_size() == 1
    kwargs = {"reshard_after_forward": fsdp.reshard_after_forward and not (trains and single_rank)}
    if mp is not None:
        kwargs["mp_policy"] = mp
    block_names = set(getattr(module, "_no_split_modules", None) or [])
    for sub in module.modules():
        is_block = type(sub).__name__ in block_names
        big = (
            fsdp.wrap_policy.min_num_params > 0
            and sum(p.numel() for p in sub.parameters()) >= fsdp.wrap_policy.min_num_params
        )
        if sub is not module and (is_block or (not block_names and big)):
            fully_shard(sub, **kwargs)
    fully_shard(module, **kwargs)
    return module


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


SHARD_ONE_GPU = True
"""Whether a single CUDA rank runs under FSDP2 too (else: the plain module under CUDA autocast)."""


class FSDPEngine(TrainEngine):
    """Train or run one HF module. ``optim=None`` makes an inference-only engine (the reference)."""

    def __init__(
        self,
        module: nn.Module,
        device: torch.device,
        fsdp: FSDPConfig,
        optim: OptimConfig | None = None,
        grad_clip: float = 1.0,
        gradient_checkpointing: bool = False,
    ) -> None:
        self.device = device
        self.lora = is_lora(module)
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.sharded = self.world_size > 1 or (device.type == "cuda" and SHARD_ONE_GPU)
        if gradient_checkpointing and optim is not None and hasattr(module, "gradient_checkpointing_enable"):
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        dtype = torch_dtype(fsdp.model_dtype) if fsdp.model_dtype else None
        module.to(device=device, dtype=dtype)
        self.module = apply_fsdp2(module, device.type, fsdp, optim is not None) if self.sharded else module
        self.grad_clip = grad_clip
        trainable = [p for p in self.module.parameters() if p.requires_grad]  # with LoRA: the adapters only
        self.optimizer = build_optimizer(trainable, optim) if optim is not None else None
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim) if optim is not None else None
        if optim is None:
            self.module.requires_grad_(False)
        # the forward under autocast: on CPU with mixed_precision.cpu_autocast, on an unsharded GPU
        self.autocast = (device.type == "cpu" and fsdp.mixed_precision.cpu_autocast) or (
            device.type == "cuda" and not self.sharded
        )
        # what the forward's matrix products compute in (the weight-sync probe's tolerance reads it)
        mixed = self.autocast or device.type == "cuda"
        self.compute_dtype = (
            torch_dtype(fsdp.mixed_precision.param_dtype) if mixed else dtype or torch.float32
        )
        on_gpu = device.type == "cuda"
        self.param_offload = fsdp.param_offload and on_gpu
        self.offloads_weights = self.param_offload
        self.optimizer_offload = fsdp.optimizer_offload and on_gpu and self.optimizer is not None
        if self.param_offload:
            self._offload_params()

    def _autocast(self):
        """The forward under autocast in ``compute_dtype`` (backward follows its casts)."""
        if self.autocast:
            return torch.autocast(self.device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ offload
    def _offload_params(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)  # the next step starts from zero anyway
        self.module.to("cpu")  # an FSDP2 module reshards first (a single rank may hold gathered weights)
        torch.cuda.empty_cache()

    @contextlib.contextmanager
    def resident(self, optimizer: bool = False) -> Iterator[None]:
        """``param_offload``: the weights on the device for this block, in host memory after it;
        ``optimizer_offload`` (with ``optimizer``): the optimizer state likewise."""
        if self.param_offload:
            self.module.to(self.device)
        if optimizer and self.optimizer_offload:
            move_optimizer_state(self.optimizer, self.device)
        try:
            yield
        finally:
            if optimizer and self.optimizer_offload:
                move_optimizer_state(self.optimizer, "cpu")
            if self.param_offload:
                self._offload_params()
            elif optimizer and self.optimizer_offload:
                torch.cuda.empty_cache()

    # ------------------------------------------------------------------ compute
    def infer(self, micro_batches: list[MicroBatch], forward_fn: ForwardFn) -> list[dict[str, torch.Tensor]]:
        self.module.eval()
        outputs = []
        with torch.no_grad(), self.resident():
            for micro in micro_batches:
                with self._autocast():
                    out = forward_fn(self.module, self._to_device(micro))
                outputs.append({k: v.detach().float().cpu() for k, v in out.items()})
        return outputs

    def train_step(
        self, micro_batches: list[MicroBatch], loss_fn: LossFn, loss_weights: list[float]
    ) -> dict[str, float]:
        if self.optimizer is None:
            raise RuntimeError("this engine was built without an optimizer (inference only)")
        self.module.train()
        with self.resident(optimizer=True):
            return self._train_step(micro_batches, loss_fn, loss_weights)

    def _train_step(
        self, micro_batches: list[MicroBatch], loss_fn: LossFn, loss_weights: list[float]
    ) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for micro, weight in zip(micro_batches, loss_weights):
            with self._autocast():
                loss, metrics = loss_fn(self.module, self._to_device(micro))
            (loss * weight).backward()
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(value) * weight
        grad_norm = float(_local(torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)))
        skipped = not torch.isfinite(torch.tensor(grad_norm))
        if skipped:
            logger.warning("non-finite gradient norm (%s): skipping this optimizer step", grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        sums.update(grad_norm=grad_norm, update_skipped=float(skipped), lr=self.current_lr())
        return sums

    def lr_scheduler_step(self) -> float:
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return self.current_lr()

    def current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0

    def _to_device(self, micro: MicroBatch) -> MicroBatch:
        return {k: v.to(self.device, non_blocking=True) for k, v in micro.items()}

    # ------------------------------------------------------------------ weights
    def full_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """With LoRA: the base model's names, adapters folded into the weights (what engines load)."""
        with self.resident():
            items = ((name, _local(tensor).detach()) for name, tensor in self.module.state_dict().items())
            yield from merged_state_dict(items, lora_scaling(self.module)) if self.lora else items

    def adapter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """LoRA: the adapters' full tensors under peft's saved names, gathered one at a time (the
        frozen base is never gathered); what an engine with LoRA support loads."""
        with self.resident():
            for name, tensor in self.module.state_dict().items():
                if is_trained(name):
                    yield from adapter_items([(name, _local(tensor).detach())]).items()

    @property
    def hf_module(self) -> nn.Module:
        """The Hugging Face model itself (under a LoRA wrapper, the base model)."""
        return self.module.get_base_model() if self.lora else self.module

    def adapter_config(self):
        """LoRA: the peft ``LoraConfig`` a saved adapter lists."""
        return self.module.peft_config[ADAPTER]

    def disabled_adapter(self):
        """A context in which the module runs without its LoRA adapters (the reference policy)."""
        if not self.lora:
            raise RuntimeError("this engine's module has no LoRA adapter to disable")
        return self.module.disable_adapter()

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False, strict=True)
        set_model_state_dict(self.module, state, options=options)

    def full_model_state_dict_on_cpu(self) -> dict[str, torch.Tensor]:
        """Full weights on CPU (every rank takes part; rank 0 gets them), for HF export."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.module, options=options)
        return dict(merged_state_dict(state.items(), lora_scaling(self.module))) if self.lora else state

    # ------------------------------------------------------------------ checkpoints
    def save(self, folder: str, contents: list[str]) -> None:
        options = self._state_options()
        save_sharded(folder, self.module, self.optimizer, self.lr_scheduler, contents, self.rank, options)

    def load(self, folder: str, contents: list[str]) -> None:
        options = self._state_options()
        load_sharded(folder, self.module, self.optimizer, self.lr_scheduler, contents, self.rank, options)

    def _state_options(self) -> StateDictOptions:
        """With LoRA a checkpoint holds the adapters only: the frozen base comes from model.path."""
        return StateDictOptions(ignore_frozen_params=True, strict=False) if self.lora else StateDictOptions()
