"""The FSDP helpers verl documents (``verl.utils.fsdp_utils``), for a module wrapped with torch's FSDP2
(``fully_shard``, what this project's engine uses) or not wrapped at all.

* :func:`get_fsdp_wrap_policy`: which submodules to wrap, as torch's FSDP1 auto-wrap policies (a
  predicate ``policy(module=..., recurse=..., nonwrapped_numel=...)``).
* :func:`get_init_weight_context_manager` / :func:`init_fn`: build the model on rank 0 only
  (other ranks on the meta device) and materialise the others' empty weights later.
* ``offload_* / load_*``: move the weights or the optimizer state to host memory and back
  (the engine's ``param_offload`` / ``optimizer_offload`` use :func:`move_optimizer_state`).

A module wrapped with FSDP1 (``FullyShardedDataParallel``) is refused where its flat parameters
would have to be moved by hand.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import (
    _or_policy,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

from verl.utils.device import get_device_id, get_torch_device, is_cuda_available

__all__ = ["fsdp_version", "get_fsdp_wrap_policy", "get_init_weight_context_manager", "init_fn"]
__all__ += ["load_fsdp_model_to_gpu", "load_fsdp_optimizer", "move_optimizer_state"]
__all__ += ["offload_fsdp_model_to_cpu", "offload_fsdp_optimizer"]


def fsdp_version(model: nn.Module) -> int:
    """1 for an FSDP1 wrapper, 2 for a module under FSDP2's ``fully_shard``, 0 otherwise."""
    if isinstance(model, FSDP):
        return 1
    return 2 if isinstance(model, FSDPModule) else 0


def _config_value(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    return config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)


def _module_class(module: nn.Module, name: str) -> type:
    for sub in module.modules():
        if type(sub).__name__ == name:
            return type(sub)
    raise ValueError(
        f"wrap_policy.transformer_layer_cls_to_wrap: the model has no submodule of class {name!r}"
    )


def get_fsdp_wrap_policy(module: nn.Module, config: Any = None, is_lora: bool = False) -> Callable | None:
    """The auto-wrap policy for ``module`` from ``fsdp_config.wrap_policy`` (a dict, DictConfig or
    dataclass): None when ``disable``; else wrap blocks of ``min_num_params`` parameters when that is
    positive, or else the classes named by ``transformer_layer_cls_to_wrap`` (default: the model's
    ``_no_split_modules``); with ``is_lora`` also every trainable leaf (the adapters)."""
    if _config_value(config, "disable", False):
        return None
    policies = []
    if is_lora:
        policies.append(functools.partial(lambda_auto_wrap_policy, lambda_fn=_is_trainable_leaf))
    min_num_params = _config_value(config, "min_num_params", 0) or 0
    class_names = _config_value(config, "transformer_layer_cls_to_wrap", None)
    class_names = class_names or getattr(module, "_no_split_modules", None)
    if min_num_params > 0:
        policies.append(functools.partial(size_based_auto_wrap_policy, min_num_params=min_num_params))
    elif class_names:
        classes = {_module_class(module, name) for name in class_names}
        policies.append(functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes))
    return functools.partial(_or_policy, policies=policies) if policies else None


def _is_trainable_leaf(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return not list(module.children()) and weight is not None and weight.requires_grad


def get_init_weight_context_manager(use_meta_tensor: bool = True, mesh: Any = None) -> Callable[[], Any]:
    """A factory of the context to build the model in: on CPU on the first rank (of ``mesh``'s last
    dimension when given), on the meta device elsewhere with ``use_meta_tensor`` (no memory; the
    weights arrive when the first rank's are broadcast, see :func:`init_fn`)."""
    if not use_meta_tensor:
        return lambda: torch.device("cpu")
    if mesh is not None:
        first = mesh.get_coordinate()[-1] == 0
    else:
        first = not dist.is_initialized() or dist.get_rank() == 0
    return (lambda: torch.device("cpu")) if first else (lambda: torch.device("meta"))


def init_fn(x: nn.Module) -> nn.Module:
    """FSDP1's ``param_init_fn``: on ranks other than 0, give ``x``'s own meta tensors empty storage on
    the device (rank 0's values are synced into them)."""
    if dist.is_initialized() and dist.get_rank() != 0:
        device = get_device_id() if is_cuda_available else "cpu"
        x = x.to_empty(device=device, recurse=False)
        if is_cuda_available:
            get_torch_device().empty_cache()
    return x


def _refuse_fsdp1(model: nn.Module, what: str) -> None:
    if fsdp_version(model) == 1:
        raise NotImplementedError(
            f"{what}: FSDP1 (FullyShardedDataParallel) modules are not supported here; wrap the model with "
            "FSDP2 (torch.distributed.fsdp.fully_shard), as the training engine does"
        )


@torch.no_grad()
def offload_fsdp_model_to_cpu(model: nn.Module, empty_cache: bool = True) -> None:
    """The weights of ``model`` (FSDP2 or plain) to host memory; FSDP2 reshards first."""
    _refuse_fsdp1(model, "offload_fsdp_model_to_cpu")
    model.to("cpu")
    if empty_cache and is_cuda_available:
        torch.cuda.empty_cache()


@torch.no_grad()
def load_fsdp_model_to_gpu(model: nn.Module) -> None:
    """The weights of ``model`` (FSDP2 or plain) back onto this rank's device."""
    _refuse_fsdp1(model, "load_fsdp_model_to_gpu")
    model.to(get_device_id() if is_cuda_available else "cpu")


@torch.no_grad()
def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str | int) -> None:
    """The optimizer's state tensors (AdamW's moments) onto ``device``; scalars (AdamW's step count,
    which it keeps on the CPU) stay where they are."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                state[key] = value.to(device)


def offload_fsdp_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's state to host memory."""
    move_optimizer_state(optimizer, "cpu")


def load_fsdp_optimizer(optimizer: torch.optim.Optimizer, device_id: torch.device | str | int) -> None:
    """The optimizer's state onto ``device_id``."""
    move_optimizer_state(optimizer, device_id)
