"""LoRA through ``peft``: an option of the training engine, not a new worker.

``model.lora_rank > 0`` wraps the loaded model in a ``peft`` LoRA model before the engine shards
it: the base weights are frozen and only the adapters (``lora_A``, ``lora_B`` of each targeted
linear layer) are trained. What changes elsewhere:

* the optimizer holds the adapters' parameters only (no AdamW state for the frozen base);
* checkpoints hold the adapters and their optimizer state only (the base is read from
  ``model.path`` again on resume and by the merger);
* :func:`merged_state_dict` turns the wrapped model's state into the base model's names with
  ``W + (alpha / r) B A`` folded in: what the rollout engines and the HF export receive;
* the reference policy is the same module with the adapters switched off (``disable_adapter``),
  so no second copy of the base weights is held;
* a classifier's head (a reward model's ``score``: new, or specific to the task) is
  trained in full next to the adapters (peft's ``modules_to_save``), and saved with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

ADAPTER = "default"
PEFT_PREFIX = "base_model.model."
ADAPTER_DIR = "lora_adapter"
SAVED_HEAD = f".modules_to_save.{ADAPTER}."
FROZEN_HEAD = ".original_module."


def uses_lora(model_config: Any) -> bool:
    """Whether ``model.{lora_rank, lora_adapter_path}`` ask for LoRA training."""
    return model_config.lora_rank > 0 or bool(model_config.lora_adapter_path)


def is_lora(module: nn.Module) -> bool:
    return hasattr(module, "peft_config")


def target_modules(value: Any) -> Any:
    """``all-linear`` (peft's spelling, every linear layer but the output head), a list, or a
    comma-separated string of module names."""
    if isinstance(value, str) and value != "all-linear":
        return [part.strip() for part in value.split(",") if part.strip()]
    return list(value) if isinstance(value, list | tuple) else value


def head_modules(module: nn.Module) -> list[str]:
    """A classifier's head: its top-level modules with weights outside the base model (``score``);
    none for a causal LM, whose output layer is not trained in full under LoRA."""
    if not type(module).__name__.endswith(("ForTokenClassification", "ForSequenceClassification")):
        return []
    return [
        name
        for name, child in module.named_children()
        if name != module.base_model_prefix and any(True for _ in child.parameters())
    ]


def apply_lora(module: nn.Module, model_config: Any) -> nn.Module:
    """``module`` wrapped for LoRA training per ``model.{lora_rank, lora_alpha, target_modules,
    exclude_modules, lora_adapter_path}``; a trained adapter is loaded (trainable) when given. A
    classifier's head (:func:`head_modules`) is trained in full."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if model_config.lora_adapter_path:
        return PeftModel.from_pretrained(module, model_config.lora_adapter_path, is_trainable=True)
    head = head_modules(module)
    config = LoraConfig(
        r=model_config.lora_rank,
        lora_alpha=model_config.lora_alpha,
        target_modules=target_modules(model_config.target_modules),
        exclude_modules=target_modules(model_config.exclude_modules)
        if model_config.exclude_modules
        else None,
        lora_dropout=0.0,
        bias="none",
        task_type="TOKEN_CLS" if head else "CAUSAL_LM",
        modules_to_save=head or None,
    )
    return get_peft_model(module, config)


def peft_settings(model_config: Any) -> dict[str, Any]:
    """``r``, ``lora_alpha`` and ``use_rslora`` of the adapter ``apply_lora`` trains for
    ``model_config`` (those of ``lora_adapter_path`` when one is given)."""
    if model_config.lora_adapter_path:
        from peft import LoraConfig

        saved = LoraConfig.from_pretrained(model_config.lora_adapter_path)
        return {"r": saved.r, "lora_alpha": saved.lora_alpha, "use_rslora": saved.use_rslora}
    return {"r": model_config.lora_rank, "lora_alpha": model_config.lora_alpha, "use_rslora": False}


def lora_scaling(module: nn.Module) -> float:
    config = module.peft_config[ADAPTER]
    rank = config.r
    return config.lora_alpha / (rank**0.5 if config.use_rslora else rank)


def base_name(name: str) -> str:
    """The base model's name of a wrapped parameter (``...q_proj.base_layer.weight`` ->
    ``...q_proj.weight``; a trained head's ``score.modules_to_save.default.weight`` -> ``score.weight``)."""
    name = name.removeprefix(PEFT_PREFIX)
    return name.replace(".base_layer.", ".").replace(SAVED_HEAD, ".")


def merged_state_dict(
    items: Iterable[tuple[str, torch.Tensor]], scaling: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """The base model's state dict with every adapter folded in: ``W + scaling * B @ A``.

    ``items`` is the wrapped model's full state dict; adapters are held until their layer is
    complete (a layer's base weight comes before its ``lora_A`` and ``lora_B``).
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in items:
        if ".lora_A." in name or ".lora_B." in name or ".base_layer.weight" in name:
            layer = name.split(".lora_")[0].split(".base_layer.")[0]
            kind = "A" if ".lora_A." in name else "B" if ".lora_B." in name else "W"
            parts = pending.setdefault(layer, {})
            parts[kind] = tensor
            if len(parts) == 3:
                weight = parts["W"].float() + scaling * (parts["B"].float() @ parts["A"].float())
                yield base_name(f"{layer}.weight"), weight.to(parts["W"].dtype)
                del pending[layer]
            continue
        if ".lora_" in name or FROZEN_HEAD in name:  # not produced by apply_lora / the head's untrained copy
            continue
        yield base_name(name), tensor
    if pending:
        raise RuntimeError(f"incomplete LoRA layers in the state dict: {sorted(pending)[:3]}")


def is_trained(name: str) -> bool:
    """A wrapped model's tensor that LoRA training changes: an adapter's, or a trained head's."""
    return ".lora_" in name or SAVED_HEAD in name


def adapter_items(items: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The adapters' (and a trained head's) tensors under peft's saved names
    (``...q_proj.lora_A.weight``, ``...score.weight``)."""
    return {
        name.replace(SAVED_HEAD, ".").replace(f".{ADAPTER}.", "."): tensor
        for name, tensor in items
        if is_trained(name)
    }
