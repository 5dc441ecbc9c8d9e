"""verl's ``FSDPCheckpointManager``: save and load a (FSDP2-sharded or plain) model with its optimizer,
LR scheduler and RNG states, every rank its own share.

The folder is written in the training engine's format (:mod:`verl.utils.checkpoint.sharded`:
``torch.distributed.checkpoint`` shards plus ``extra_rank_R.pt``), so a manager loads the
``global_step_N/actor`` folder of a run of this project, and the trainer resumes from a folder a
manager wrote. verl itself writes ``model_world_size_W_rank_R.pt`` files instead; those are not
read here. Rank 0 also writes ``huggingface/``: the model's config and the tokenizer or processor
(and full weights when ``save_contents`` has ``hf_model``), what ``python -m verl.model_merger``
and ``from_pretrained`` read.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager
from verl.utils.checkpoint.sharded import load_sharded, save_sharded
from verl.utils.fs import local_mkdir_safe
from verl.utils.hf_files import save_hf_files

__all__ = ["FSDPCheckpointManager"]

logger = logging.getLogger(__name__)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


class FSDPCheckpointManager(BaseCheckpointManager):
    """``FSDPCheckpointManager(model, optimizer, lr_scheduler, processing_class, checkpoint_config)``;
    every rank calls :meth:`save_checkpoint` / :meth:`load_checkpoint` with the same folder."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        processing_class: Any = None,
        checkpoint_config: Any = None,
        **kwargs: Any,
    ) -> None:
        if processing_class is None and "tokenizer" in kwargs:
            warnings.warn(
                "FSDPCheckpointManager: `tokenizer` is deprecated, pass `processing_class`", stacklevel=2
            )
            processing_class = kwargs.pop("tokenizer")
        if kwargs:
            raise TypeError(f"FSDPCheckpointManager got unexpected arguments {sorted(kwargs)}")
        super().__init__(model, optimizer, lr_scheduler, processing_class, checkpoint_config)

    def _check_parts(self, contents: list[str], action: str) -> None:
        if "model" in contents and self.model is None:
            raise ValueError(f"checkpoint.{action}_contents has 'model' but no model was given")
        if "optimizer" in contents and self.optimizer is None:
            raise ValueError(f"checkpoint.{action}_contents has 'optimizer' but no optimizer was given")

    def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: str | None = None,
        global_step: int = 0,
        max_ckpt_to_keep: int | None = None,
    ) -> None:
        """Write this rank's share to ``local_path`` (``hdfs_path`` is accepted and unused, as in
        verl); keep at most ``max_ckpt_to_keep`` of the folders this manager wrote."""
        if local_path is None:
            return
        contents = self.checkpoint_save_contents
        self._check_parts(contents, "save")
        self.previous_global_step = global_step
        if self.rank == 0:
            self.ensure_checkpoint_capacity(max_ckpt_to_keep)
        local_path = local_mkdir_safe(local_path)
        _barrier()
        extra = {"rng": self.get_rng_state()}
        save_sharded(
            local_path, self.model, self.optimizer, self.lr_scheduler, contents, self.rank, extra=extra
        )
        full = self._full_state_dict() if self.should_save_hf_model else None
        if self.rank == 0:
            self._save_huggingface(os.path.join(local_path, "huggingface"), full)
        _barrier()
        if self.rank == 0:
            self.register_checkpoint(local_path, max_ckpt_to_keep)
        else:
            self.previous_saved_paths.append(local_path)
        logger.info("saved checkpoint %s (rank %d)", local_path, self.rank)

    def load_checkpoint(
        self, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        """Load this rank's share from ``local_path`` (None: nothing to load); the RNG states too
        when ``load_contents`` has ``extra``."""
        if local_path is None:
            return
        contents = self.checkpoint_load_contents
        self._check_parts(contents, "load")
        extra = load_sharded(local_path, self.model, self.optimizer, self.lr_scheduler, contents, self.rank)
        if "rng" in extra:
            self.load_rng_state(extra["rng"])
        _barrier()

    def _full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights on CPU (a collective: every rank calls it)."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def _save_huggingface(self, target: str, state_dict: dict[str, torch.Tensor] | None) -> None:
        module = getattr(self.model, "_fsdp_wrapped_module", self.model)
        if getattr(module, "config", None) is None or not hasattr(module.config, "save_pretrained"):
            return  # not a Hugging Face model: nothing to describe it with
        if self.processing_class is not None:
            save_hf_files(module, self.processing_class, target, state_dict)
        elif state_dict is not None:
            module.save_pretrained(target, state_dict=state_dict)
        else:
            module.config.save_pretrained(target)
