"""The Megatron-core training engine (``strategy=megatron``): tensor, pipeline and data parallel.

The ranks of a role form megatron-core's groups (``tensor_model_parallel_size`` x
``pipeline_model_parallel_size`` ranks hold one copy of the model; data parallel = ranks / (TP x
PP)). The Hugging Face model the worker loads is converted into a ``GPTModel`` shard
(:mod:`~verl.workers.engine.megatron.weights`) and dropped; training runs megatron-core's DDP and
optimizer (``use_distributed_optimizer`` shards its state over the data-parallel ranks).

The worker's functions stay the engine-independent ones of :mod:`verl.workers.forward`: they get a
:class:`StageModule` in place of the HF module. Called like a causal LM it runs this rank's pipeline
stage; on the last stage it returns the vocab-parallel logits (which :mod:`verl.workers.forward`
turns into log-probs with :mod:`~verl.workers.engine.megatron.vocab_parallel`, no vocabulary
gathered) and the worker's loss follows as on FSDP. On an earlier stage the call ends the micro-batch
with the stage's hidden states (:class:`StageOutput`), which megatron-core's pipeline schedule
(1F1B) sends on to the next stage. Every rank of a model-parallel group holds the same rows
(:attr:`MegatronEngine.rows_group`); the last stage's outputs are broadcast to the group.

``param_offload``, ``grad_offload`` and ``optimizer_offload`` keep the weights, the grad buffers and
the optimizer state in host memory between calls (:mod:`~verl.workers.engine.megatron.offload`):
each call (``infer``, ``train_step``, ``full_state_dict``, ``save``, ``load``) brings back what it
uses for its duration.

With LoRA (``lora``) the base weights are frozen before DDP and the optimizer are built and adapters
train on the decoder layers' linears (:mod:`~verl.workers.engine.megatron.lora`); exports fold them in.
DDP, the optimizer and its clipped step are in :mod:`~verl.workers.engine.megatron.optimizer`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from verl.config.engine import OptimConfig
from verl.workers.engine.base import ForwardFn, LossFn, MicroBatch, TrainEngine
from verl.workers.engine.megatron.checkpoint import ShardedCheckpoint
from verl.workers.engine.megatron.groups import (
    check_device,
    ensure_process_group,
    expert_sizes,
    init_model_parallel,
)
from verl.workers.engine.megatron.lora import LoraAdapters
from verl.workers.engine.megatron.moe import router_losses
from verl.workers.engine.megatron.offload import Offload
from verl.workers.engine.megatron.optimizer import optimizer_step, wrap_for_training
from verl.workers.engine.optim import lr_multiplier

if TYPE_CHECKING:
    from verl.config.megatron import MegatronConfig
    from verl.workers.engine.megatron.lora import LoraSettings

logger = logging.getLogger(__name__)


class StageOutput(Exception):
    """Raised by :class:`StageModule` on a pipeline stage before the last: the stage's output."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__("pipeline stage output")
        self.tensor = tensor


def causal_padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """megatron-core's boolean mask ``[b, 1, s, s]`` (True = not attended): causal, and no padding
    key (the rows of pad queries attend to nothing and give outputs no one reads)."""
    s = attention_mask.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril()
    return ~(causal[None, None] & attention_mask.bool()[:, None, None, :])


class StageModule(nn.Module):
    """This rank's pipeline stage, called like a transformers causal LM (see the module doc)."""

    def __init__(self, model: nn.Module, last_stage: bool, vocab_parallel_group) -> None:
        super().__init__()
        self.model = model
        self.last_stage = last_stage
        self.vocab_parallel_group = vocab_parallel_group
        """The group the logits' vocabulary is split over (None: one rank holds all of it)."""

    def forward(self, input_ids, attention_mask, position_ids, use_cache=False, logits_to_keep=0):
        out = self.model(input_ids, position_ids, causal_padding_mask(attention_mask))
        if not self.last_stage:
            raise StageOutput(out)
        return SimpleNamespace(logits=out[:, -logits_to_keep:] if logits_to_keep else out)


class MegatronEngine(ShardedCheckpoint, LoraAdapters, TrainEngine):
    """Train or run one HF model as megatron-core shards; ``optim=None``: inference only."""

    packs_sequences = False
    """The local layer spec's attention has no variable-length path: with ``use_remove_padding`` a
    packed row would cost (sum of lengths)^2 attention scores instead of rows x length^2, so
    micro-batches run padded (the same values; the token budgets of dynamic batches still apply)."""

    def __init__(
        self,
        hf_module: nn.Module,
        device: torch.device,
        megatron: MegatronConfig,
        key: str,
        dtype: torch.dtype = torch.float32,
        optim: OptimConfig | None = None,
        grad_clip: float = 1.0,
        value_head: bool = False,
        gradient_checkpointing: bool = False,
        lora: LoraSettings | None = None,
    ) -> None:
        from megatron.core import parallel_state as ps
        from verl.workers.engine.megatron.arch import build_model, check_parallel, transformer_config
        from verl.workers.engine.megatron.dist_checkpoint import load_dist_checkpoint
        from verl.workers.engine.megatron.weights import load_hf_state

        check_device(device, key)
        ensure_process_group(device)
        init_model_parallel(megatron, key)
        self.device, self.key, self.lora, self.value_head = device, key, lora is not None, value_head
        self.lora_settings = lora
        """LoRA's rank, alpha and targets (None: every weight trains)."""
        self.rank = dist.get_rank()
        self.hf_module = hf_module
        tp, pp = megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size
        ep, etp = expert_sizes(megatron)
        check_parallel(self.hf_config, tp, pp, key=key, ep=ep, etp=etp)
        if lora is not None:
            from verl.workers.engine.megatron.lora import check_lora_model

            check_lora_model(self.hf_config, lora)
        self.compute_dtype = dtype
        """The weights' dtype: bf16/fp16 with fp32 master weights in the optimizer, or fp32."""
        config = transformer_config(
            self.hf_config,
            tp=tp,
            pp=pp,
            dtype=self.compute_dtype,
            overrides=dict(megatron.override_transformer_config or {}),
            sequence_parallel=megatron.sequence_parallel and tp > 1,  # the local spec turns it off, saying so
            expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
        )
        config.variable_seq_lengths = (
            True  # micro-batches differ in length (dynamic batches, padding dropped)
        )
        if gradient_checkpointing and optim is not None:
            config.recompute_granularity, config.recompute_method, config.recompute_num_layers = (
                "full",
                "uniform",
                1,
            )
        self.first_stage, self.last_stage = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        model = build_model(
            self.hf_config,
            config,
            pre_process=self.first_stage,
            post_process=self.last_stage,
            value_head=value_head,
        )
        if megatron.use_dist_checkpointing:  # verl's pre-converted weights, at any layout
            load_dist_checkpoint(
                model,
                megatron.dist_checkpointing_path,
                key,
                megatron.dist_checkpointing_prefix,
                hf_module.state_dict(),
            )
        else:
            load_hf_state(model, self.hf_config, hf_module.state_dict())
        hf_module.to("meta")  # its config and class stay (for exports); its weights are the shards now
        self.config = config
        self.grad_clip = grad_clip
        self.optim_config = optim
        self.optimizer = None
        model.to(device)
        if lora is not None:  # before DDP and the optimizer are built: they hold the adapters only
            from verl.workers.engine.megatron.lora import attach_lora

            attach_lora(model, lora, key)
        if optim is None:
            model.requires_grad_(False)
        else:
            model, self.optimizer = wrap_for_training(
                model, config, megatron, optim, self.compute_dtype, grad_clip, device, key
            )
            self._set_lr(optim.lr * lr_multiplier(0, optim))
        self.module = model
        self.lr_step = 0
        self.vocab_group = ps.get_tensor_model_parallel_group() if tp > 1 and not value_head else None
        self.stage = StageModule(model, self.last_stage, self.vocab_group)
        self.rows_group = ps.get_model_parallel_group() if tp * pp > 1 else None
        """Ranks that hold the same rows (one model copy): they gather their shares of a batch."""
        self.replicas = tp * pp
        self.offload = Offload(
            model,
            self.optimizer,
            device,
            weights=megatron.param_offload,
            grads=megatron.grad_offload,
            optimizer_state=megatron.optimizer_offload,
        )
        """What lives in host memory between calls (the three ``*_offload`` keys)."""
        self.offloads_weights = megatron.param_offload

    def resident(self, optimizer: bool = False):
        """The offloaded weights (and optimizer state with ``optimizer``) on the device for a block."""
        return self.offload.resident(optimizer=optimizer)

    def data_parallel_rank(self) -> int:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_rank()

    # ------------------------------------------------------------------ compute
    def _schedule(self, micro_batches: list[MicroBatch], step, forward_only: bool) -> list:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micro_batches = [{k: v.to(self.device) for k, v in m.items()} for m in micro_batches]
        return get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=iter(micro_batches),
            model=[self.module],
            num_microbatches=len(micro_batches),
            seq_length=max(m["input_ids"].shape[1] for m in micro_batches),
            micro_batch_size=max(len(m["input_ids"]) for m in micro_batches),
            forward_only=forward_only,
        )

    def _stage_call(self, fn, micro):
        """``fn(stage, micro)`` on the last stage; the stage's output tensor on the others."""
        try:
            return fn(self.stage, micro)
        except StageOutput as out:
            return out.tensor

    def infer(self, micro_batches: list[MicroBatch], forward_fn: ForwardFn) -> list[dict[str, torch.Tensor]]:
        self.module.eval()

        def step(data_iterator, model):
            out = self._stage_call(forward_fn, next(data_iterator))
            if not self.last_stage:
                return out, None
            done = {k: v.detach().float() for k, v in out.items()}
            return torch.zeros((), device=self.device), lambda t: (t, done)

        with torch.no_grad(), self.offload.resident():
            outputs = self._schedule(micro_batches, step, forward_only=True)
        return [{k: v.cpu() for k, v in o.items()} for o in self._from_last_stage(outputs)]

    def _from_last_stage(self, value):
        """``value`` of the last pipeline stage, on every stage (the same rows' results)."""
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() == 1:
            return value
        box = [value if self.last_stage else None]
        dist.broadcast_object_list(
            box, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group()
        )
        return box[0]

    def train_step(
        self, micro_batches: list[MicroBatch], loss_fn: LossFn, loss_weights: list[float]
    ) -> dict[str, float]:
        if self.optimizer is None:
            raise RuntimeError("this engine was built without an optimizer (inference only)")
        with self.offload.resident(grads=True, optimizer=True):
            return self._train_step(micro_batches, loss_fn, loss_weights)

    def _train_step(
        self, micro_batches: list[MicroBatch], loss_fn: LossFn, loss_weights: list[float]
    ) -> dict[str, float]:
        self.module.train()
        self.module.zero_grad_buffer()
        self.optimizer.zero_grad()
        weights = iter(loss_weights)
        count = len(micro_batches)

        def step(data_iterator, model):
            out = self._stage_call(loss_fn, next(data_iterator))
            weight = next(weights)
            if not self.last_stage:
                return out, None
            loss, metrics = out
            # the schedule divides each micro-batch's loss by their number: undo it, weigh as FSDP does
            return loss * (weight * count), lambda t: (t, {k: float(v) * weight for k, v in metrics.items()})

        per_micro = self._from_last_stage(self._schedule(micro_batches, step, forward_only=False))
        sums: dict[str, float] = {}
        for metrics in per_micro:
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
        sums.update(router_losses(self.config, count))
        grad_norm, skipped = optimizer_step(self.optimizer, self.grad_clip)
        if skipped:
            logger.warning("non-finite gradient norm (%s): skipping this optimizer step", grad_norm)
        sums.update(grad_norm=grad_norm, update_skipped=float(skipped), lr=self.current_lr())
        return sums

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def lr_scheduler_step(self) -> float:
        if self.optimizer is not None:
            self.lr_step += 1
            self._set_lr(self.optim_config.lr * lr_multiplier(self.lr_step, self.optim_config))
        return self.current_lr()

    def current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else 0.0

    # ------------------------------------------------------------------ weights
    def _bare_model(self) -> nn.Module:
        return self.module.module if self.optimizer is not None else self.module

    def full_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors on every rank, gathered one at a time over TP and PP (the names of
        the HF module's state dict: a tied ``lm_head.weight`` too). With ``param_offload`` the weights
        are on the device until the last tensor is read (a tensor that views them is a copy). With
        LoRA the adapters are folded in (``W + s B A`` on each shard before the gather)."""
        from verl.workers.engine.megatron.lora import merged_weight
        from verl.workers.engine.megatron.weights import export_hf_state

        tied = self.hf_config.tie_word_embeddings and not self.value_head
        with self.offload.resident():
            model = self._bare_model()
            merged = merged_weight(model) if self.lora else None
            for name, tensor in export_hf_state(model, self.hf_config, self.value_head, merged):
                tensor = self.offload.outliving(tensor)
                yield name, tensor
                if tied and name == "model.embed_tokens.weight":  # transformers' state dict lists both
                    yield "lm_head.weight", tensor

    def full_model_state_dict_on_cpu(self) -> dict[str, torch.Tensor]:
        return {name: tensor.cpu() for name, tensor in self.full_state_dict()}

    # ------------------------------------------------------------------ checkpoints
    def save(self, folder: str, contents: list[str]) -> None:
        with self.offload.resident(optimizer="optimizer" in contents):
            super().save(folder, contents)

    def load(self, folder: str, contents: list[str]) -> None:
        with self.offload.resident(optimizer="optimizer" in contents):
            super().load(folder, contents)

    def parameter_count(self) -> int:
        """Parameters of the whole model (every shard)."""
        count = sum(p.numel() for p in self._bare_model().parameters())
        local = torch.tensor(count, dtype=torch.int64, device=self.device)  # nccl reduces device tensors
        from megatron.core import parallel_state as ps

        dist.all_reduce(local, group=ps.get_model_parallel_group())
        return int(local)
