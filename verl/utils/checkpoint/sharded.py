"""One role's sharded checkpoint in a folder: what the training engine writes for the actor and the
critic, and what :class:`~verl.utils.checkpoint.fsdp_checkpoint_manager.FSDPCheckpointManager`
writes for a model it is handed.

    <folder>/
        .metadata, __0_0.distcp, ...   torch.distributed.checkpoint (DCP) of {"model", "optimizer"}:
                                       every rank writes its own shards (plain module, FSDP2 or FSDP1)
        extra_rank_R.pt                rank R's LR-scheduler state (+ its RNG states, from the manager)

``contents`` is verl's ``checkpoint.save_contents`` / ``load_contents`` list: ``model``,
``optimizer``, ``extra`` (the LR schedule). A truncated or corrupt shard is reported by name
(:func:`verl.utils.checkpoint_io.read_error`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from verl.utils.checkpoint_io import find_truncated_dcp_file, read_error, torch_load

__all__ = ["extra_state_path", "load_sharded", "save_sharded"]


def extra_state_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"extra_rank_{rank}.pt")


def _dcp_state(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    contents: list[str],
    options: StateDictOptions | None,
) -> dict[str, Any]:
    optimizers = [optimizer] if optimizer is not None and "optimizer" in contents else []
    model_sd, optim_sd = get_state_dict(module, optimizers, options=options)
    state: dict[str, Any] = {}
    if "model" in contents:
        state["model"] = model_sd
    if optimizers:
        state["optimizer"] = optim_sd
    return state


def save_sharded(
    folder: str,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: Any,
    contents: list[str],
    rank: int,
    options: StateDictOptions | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write this rank's shards of what ``contents`` names to ``folder`` (every rank calls this);
    ``extra`` entries go into ``extra_rank_R.pt`` next to the LR-scheduler state."""
    state = _dcp_state(module, optimizer, contents, options)
    if state:
        dcp.save(state, checkpoint_id=folder)
    if "extra" in contents and (lr_scheduler is not None or extra):
        saved = dict(extra or {})
        if lr_scheduler is not None:
            saved["lr_scheduler"] = lr_scheduler.state_dict()
        torch.save(saved, extra_state_path(folder, rank))


def load_sharded(
    folder: str,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: Any,
    contents: list[str],
    rank: int,
    options: StateDictOptions | None = None,
) -> dict[str, Any]:
    """Load what ``contents`` names from ``folder`` into ``module`` / ``optimizer`` / ``lr_scheduler``;
    returns this rank's extra state (empty when there is none)."""
    state = _dcp_state(module, optimizer, contents, options)
    if state:
        try:
            dcp.load(state, checkpoint_id=folder)
        except (Exception, CheckpointException) as error:  # the latter is a BaseException
            culprit = find_truncated_dcp_file(folder)
            if culprit is None:
                raise
            raise read_error(culprit, error) from error
        if "optimizer" in state:
            set_state_dict(
                module,
                optimizer,
                model_state_dict=state.get("model"),
                optim_state_dict=state["optimizer"],
                options=options,
            )
        else:
            set_model_state_dict(module, state["model"], options=options)
    path = extra_state_path(folder, rank)
    if "extra" not in contents or not os.path.exists(path):
        return {}
    extra = torch_load(path)
    if lr_scheduler is not None and extra.get("lr_scheduler") is not None:
        lr_scheduler.load_state_dict(extra["lr_scheduler"])
    return extra
