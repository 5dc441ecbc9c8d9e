"""LoRA on the Megatron engine: adapters on megatron-core's tensor-parallel linears.

Each targeted linear of a decoder layer keeps its module and parameter names (so
:mod:`~verl.workers.engine.megatron.weights` finds ``...linear_qkv.weight`` as before) and gains a
child ``lora`` with ``lora_A`` and ``lora_B``; a forward hook adds ``s * B A x`` (``s = alpha / r``)
to the linear's output (megatron linears return ``(output, bias)``). With tensor parallelism:

* column-parallel (``linear_qkv``, ``linear_fc1``: output rows split): ``A [r, in]`` whole on every
  rank, ``B [out_local, r]`` split like the weight's rows. ``h = A x`` passes through
  ``copy_to_tensor_model_parallel_region`` (identity forward; backward all-reduces the gradient,
  since ``A``'s gradient needs every rank's rows of ``B``), then ``y_local += s B_local h``;
* row-parallel (``linear_proj``, ``linear_fc2``: input columns split): ``A [r, in_local]`` split like
  the weight's columns, ``B [out, r]`` whole; ``h = reduce_from_tensor_model_parallel_region(A_local
  x_local)`` (all-reduce forward), ``y += s B h``.

The adapters start as peft's do (``A`` kaiming-uniform with ``a = sqrt(5)``, ``B`` zero: step 0 is the
base model). ``A`` is drawn whole from a generator seeded by the layer and target, then sliced, so
every rank (tensor, pipeline or data parallel) holds the same adapter whatever the layout.

A fused linear has one ``A``: peft's ``q_proj``, ``k_proj`` and ``v_proj`` (``gate_proj``,
``up_proj``) adapters are one megatron adapter whose ``A`` they share and whose ``B`` rows they split
(:func:`adapter_slots` gives the HF names and the row layout, those of the base weight's slot).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from verl.config.base import ConfigError
from verl.config.megatron import LORA_TARGETS as HF_TARGETS
from verl.workers.engine.lora import PEFT_PREFIX

COLUMN = ("linear_qkv", "linear_fc1")
ROW = ("linear_proj", "linear_fc2")
SEED = 1234
"""Base seed of the adapters' ``A`` (fixed: every rank must draw the same adapter)."""


@dataclass(frozen=True)
class LoraSettings:
    """What the engine attaches: rank, alpha and the megatron targets (``config.megatron``'s
    :func:`~verl.config.megatron.megatron_lora_targets`)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    key: str = "actor_rollout_ref.model"
    """The config section the settings come from (named in errors)."""

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_config(self):
        """The peft ``LoraConfig`` of these adapters under HF names (what a saved adapter lists)."""
        from peft import LoraConfig

        names = sorted(n for t in self.targets for n in HF_TARGETS[t])
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=names,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )


class LoraAdapter(nn.Module):
    """One linear's adapter (``lora_A``, ``lora_B``) and the hook that adds its term."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, scaling: float, column: bool) -> None:
        super().__init__()
        self.lora_A = nn.Parameter(a)
        self.lora_B = nn.Parameter(b)
        self.scaling, self.column, self.enabled = scaling, column, True

    def hook(self, module: nn.Module, args: tuple, output: tuple) -> tuple:
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        if not self.enabled:
            return output
        out, bias = output
        h = F.linear(args[0], self.lora_A)
        if self.column:
            h = copy_to_tensor_model_parallel_region(h)
        else:
            h = reduce_from_tensor_model_parallel_region(h)
        return out + self.scaling * F.linear(h, self.lora_B), bias


def _set_tp_attributes(param: nn.Parameter, dim: int) -> None:
    from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

    set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)


def _new_adapter(linear: nn.Module, target: str, layer: int, settings: LoraSettings) -> LoraAdapter:
    """peft's initial adapter for ``linear`` (global layer ``layer``), this rank's slices."""
    from megatron.core import parallel_state as ps

    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    weight, r, column = linear.weight, settings.rank, target in COLUMN
    out_local, in_local = weight.shape
    full_in = in_local if column else in_local * tp
    g = torch.Generator().manual_seed(SEED + 4 * layer + list(HF_TARGETS).index(target))
    bound = 1 / math.sqrt(full_in)  # kaiming_uniform_(a=sqrt(5)) as nn.Linear and peft draw it
    a = torch.empty(r, full_in).uniform_(-bound, bound, generator=g)
    if not column:
        a = a.chunk(tp, dim=1)[rank]
    b = torch.zeros(out_local, r)  # a row-parallel B is whole: out_local is all of out
    kw = dict(dtype=weight.dtype, device=weight.device)
    adapter = LoraAdapter(a.to(**kw).contiguous(), b.to(**kw), settings.scaling, column)
    _set_tp_attributes(adapter.lora_B if column else adapter.lora_A, 0 if column else 1)
    return adapter


def check_lora_model(hf_config, settings: LoraSettings) -> None:
    """Refuse a model the adapters cannot cover: a MoE model's experts are grouped linears."""
    from verl.workers.engine.megatron.moe import experts

    if experts(hf_config) is not None:
        raise ConfigError(
            f"{settings.key}.lora_rank: expected 0 for the MoE model {hf_config.model_type} with "
            f"strategy=megatron (LoRA on the experts' grouped linears is not implemented on the Megatron "
            f"engine; use strategy=fsdp), got {settings.rank}"
        )


def attach_lora(model: nn.Module, settings: LoraSettings, key: str) -> None:
    """Freeze ``model`` and add an adapter to each targeted linear of its decoder layers."""
    if model.config.sequence_parallel:  # the column-parallel term would see a sequence-split input
        raise ConfigError(f"{key}.sequence_parallel: expected False with LoRA, got True")
    model.requires_grad_(False)
    for layer in model.decoder.layers:
        for target in settings.targets:
            parent = layer.self_attention if target in ("linear_qkv", "linear_proj") else layer.mlp
            linear = getattr(parent, target)
            linear.lora = _new_adapter(linear, target, layer.layer_number - 1, settings)
            linear.register_forward_hook(linear.lora.hook)


def adapters(model: nn.Module) -> list[LoraAdapter]:
    return [m for m in model.modules() if isinstance(m, LoraAdapter)]


@contextlib.contextmanager
def disabled(model: nn.Module) -> Iterator[None]:
    """The model without its adapters for a block (the reference policy)."""
    held = adapters(model)
    for adapter in held:
        adapter.enabled = False
    try:
        yield
    finally:
        for adapter in held:
            adapter.enabled = True


def merged_weight(model: nn.Module) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """``(name, local weight) -> W + s B A`` on this rank's shard for an adapted linear's weight (the
    tensor itself for any other): what the export gathers, adapters folded in."""
    modules = dict(model.named_modules())

    def merged(name: str, weight: torch.Tensor) -> torch.Tensor:
        owner = modules.get(name.removesuffix(".weight")) if name.endswith(".weight") else None
        lora = getattr(owner, "lora", None)
        if not isinstance(lora, LoraAdapter):
            return weight
        delta = lora.lora_B.detach().float() @ lora.lora_A.detach().float()
        return (weight.detach().float() + lora.scaling * delta).to(weight.dtype)

    return merged


# ---------------------------------------------------------------------------- HF (peft) names
def adapter_slots(weight_slots: list, rank: int) -> list[tuple[Any, Any]]:
    """For each adapted weight's slot: the slots of its ``lora_A`` and ``lora_B`` (for
    :func:`~verl.workers.engine.megatron.weights.export_slots`), named by peft's saved names. A
    fused layer's ``A`` slot lists every HF name (one tensor for each), its ``B`` slot is laid out
    like the weight (its HF tensors are the weight's rows)."""
    out = []
    for slot in weight_slots:
        prefix = slot.suffix.removesuffix(".weight")
        column = prefix.endswith(COLUMN)
        hf = [PEFT_PREFIX + n.removesuffix(".weight") for n in slot.hf]
        rows, cols = slot.shape
        a = dataclasses.replace(
            slot,
            suffix=prefix + ".lora.lora_A",
            hf=tuple(n + ".lora_A.weight" for n in hf),
            kind="plain",
            split=None if column else 1,
            shape=(rank, cols),
        )
        b = dataclasses.replace(
            slot,
            suffix=prefix + ".lora.lora_B",
            hf=tuple(n + ".lora_B.weight" for n in hf),
            split=0 if column else None,
            shape=(rows, rank),
        )
        out.append((a, b))
    return out


def targeted_slots(all_slots: list, targets: tuple[str, ...]) -> list:
    """The weight slots of the adapted linears (decoder layers, dense MLPs)."""
    return [
        s
        for s in all_slots
        if s.layer >= 0
        and not s.experts
        and s.suffix.endswith(".weight")
        and s.suffix.removesuffix(".weight").rsplit(".", 1)[-1] in targets
        and s.suffix.startswith(("self_attention.", "mlp.linear"))
    ]


def _lora_slots(hf_config, settings: LoraSettings) -> list[tuple[Any, Any]]:
    from megatron.core import parallel_state as ps
    from verl.workers.engine.megatron.layout import slots

    tp = ps.get_tensor_model_parallel_world_size()
    return adapter_slots(targeted_slots(slots(hf_config, tp=tp), settings.targets), settings.rank)


def export_adapters(
    model: nn.Module, hf_config, settings: LoraSettings
) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapters' full tensors under peft's saved names, the same sequence on every rank (every
    rank of the model-parallel group must consume it: it runs collectives)."""
    from verl.workers.engine.megatron.layout import _to_hf
    from verl.workers.engine.megatron.weights import export_slots

    pairs = _lora_slots(hf_config, settings)
    for slot, full in export_slots(model, [s for pair in pairs for s in pair]):
        if slot.suffix.endswith("lora_A"):  # a fused layer's HF linears share its A (a copy each:
            # safetensors refuses tensors that share memory)
            yield from ((name, full if i == 0 else full.clone()) for i, name in enumerate(slot.hf))
        else:
            yield from zip(slot.hf, _to_hf(slot, full, hf_config))


def load_adapters(model: nn.Module, hf_config, settings: LoraSettings, tensors: dict) -> None:
    """Copy peft-named adapters (:func:`export_adapters`' names) into this rank's slices. A fused
    layer's HF linears must share one ``A`` (megatron adapts the fused linear once)."""
    from megatron.core import parallel_state as ps
    from verl.workers.engine.megatron.layout import _shard, _to_full
    from verl.workers.engine.megatron.weights import _layer_offset

    tp, rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    offset, count = _layer_offset(model), len(model.decoder.layers)
    params, pairs = dict(model.named_parameters()), _lora_slots(hf_config, settings)
    missing = [n for pair in pairs for s in pair for n in s.hf if n not in tensors]
    if missing:
        raise KeyError(f"adapter tensors absent: {missing[:4]}")
    with torch.no_grad():
        for a_slot, b_slot in pairs:
            if not offset <= a_slot.layer < offset + count:
                continue
            a = [tensors[n] for n in a_slot.hf]
            if any(not torch.equal(a[0], other) for other in a[1:]):
                raise ValueError(f"{list(a_slot.hf)}: megatron's fused linear takes one lora_A, these differ")
            params[a_slot.local_name(offset)].copy_(_shard(a_slot, a[0], tp, rank))
            full_b = _to_full(b_slot, [tensors[n] for n in b_slot.hf], hf_config)
            params[b_slot.local_name(offset)].copy_(_shard(b_slot, full_b, tp, rank))


class LoraAdapters:
    """The LoRA methods of :class:`~verl.workers.engine.megatron.engine.MegatronEngine` (a mixin: it
    reads the engine's ``lora``, ``lora_settings``, ``offload``, ``optimizer``, ``hf_config`` and
    ``_bare_model()``), named as the FSDP engine's."""

    def _lora_only(self) -> None:
        if not self.lora:
            raise RuntimeError("this engine's model has no LoRA adapter")

    def disabled_adapter(self):
        """A context in which the model runs without its LoRA adapters (the reference policy)."""
        self._lora_only()
        return disabled(self._bare_model())

    def adapter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """LoRA: the adapters' full tensors under peft's saved names (what vLLM loads), gathered
        one at a time; every rank takes part."""
        self._lora_only()
        with self.offload.resident():
            for name, tensor in export_adapters(self._bare_model(), self.hf_config, self.lora_settings):
                yield name, self.offload.outliving(tensor)

    def adapter_config(self):
        """The peft ``LoraConfig`` a saved adapter lists (HF target names)."""
        self._lora_only()
        return self.lora_settings.peft_config()

    def load_adapters(self, tensors: dict[str, torch.Tensor]) -> None:
        """Peft-named adapters (:meth:`adapter_tensors`' names) into this rank's slices."""
        self._lora_only()
        with self.offload.resident():
            load_adapters(self._bare_model(), self.hf_config, self.lora_settings, tensors)
            if self.optimizer is not None:  # bf16: the optimizer's fp32 copies follow the new values
                self.optimizer.reload_model_params()
