"""Finding a run's latest checkpoint, and what every checkpoint manager shares (verl's
``verl.utils.checkpoint.checkpoint_manager``).

The on-disk layout is the trainer's (:mod:`verl.trainer.ppo.checkpoint`), which is verl's::

    <trainer.default_local_dir>/
        latest_checkpointed_iteration.txt   "N", written after global_step_N is complete
        global_step_N/ ...
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from verl.utils.checkpoint_io import POINTER_FILE

__all__ = ["BaseCheckpointManager", "find_latest_ckpt_path", "get_checkpoint_tracker_filename"]

logger = logging.getLogger(__name__)

DEFAULT_CONTENTS = ("model", "optimizer", "extra")


def get_checkpoint_tracker_filename(root_path: str) -> str:
    """The file under ``root_path`` that names the latest complete step."""
    return os.path.join(root_path, POINTER_FILE)


def find_latest_ckpt_path(path: str | None, directory_format: str = "global_step_{}") -> str | None:
    """``<path>/global_step_N`` for the step ``N`` that ``latest_checkpointed_iteration.txt`` names;
    None when ``path`` is None, has no such file yet, or the folder it names is missing."""
    if path is None:
        return None
    tracker = get_checkpoint_tracker_filename(path)
    if not os.path.exists(tracker):
        logger.info("no checkpoint yet: %s does not exist", tracker)
        return None
    with open(tracker) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise ValueError(f"{tracker} should hold one step number, found {text!r}")
    folder = os.path.join(path, directory_format.format(int(text)))
    if not os.path.exists(folder):
        logger.warning("%s names step %s, but %s does not exist", tracker, text, folder)
        return None
    return folder


def _contents(config: Any, key: str) -> list[str]:
    value = None
    if config is not None:
        value = config.get(key) if hasattr(config, "get") else getattr(config, key, None)
    return list(value) if value is not None else list(DEFAULT_CONTENTS)


class BaseCheckpointManager:
    """Saves and loads a model, its optimizer, LR scheduler and RNG states, every rank its own share.

    ``checkpoint_config`` (a dict, DictConfig or the config's ``checkpoint`` dataclass) lists what to
    write and read in ``save_contents`` / ``load_contents`` (default ``model, optimizer, extra``;
    ``hf_model`` adds full Hugging Face weights under ``huggingface/``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        lr_scheduler: Any = None,
        processing_class: Any = None,
        checkpoint_config: Any = None,
    ) -> None:
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.processing_class = processing_class
        self.checkpoint_config = checkpoint_config
        self.checkpoint_save_contents = _contents(checkpoint_config, "save_contents")
        self.checkpoint_load_contents = _contents(checkpoint_config, "load_contents")
        self.previous_global_step: int | None = None
        self.previous_saved_paths: list[str] = []
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1

    should_save_model = property(lambda self: "model" in self.checkpoint_save_contents)
    should_save_optimizer = property(lambda self: "optimizer" in self.checkpoint_save_contents)
    should_save_extra = property(lambda self: "extra" in self.checkpoint_save_contents)
    should_save_hf_model = property(lambda self: "hf_model" in self.checkpoint_save_contents)
    should_load_model = property(lambda self: "model" in self.checkpoint_load_contents)
    should_load_optimizer = property(lambda self: "optimizer" in self.checkpoint_load_contents)
    should_load_extra = property(lambda self: "extra" in self.checkpoint_load_contents)

    def load_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
    ):
        raise NotImplementedError

    def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: str | None = None,
        global_step: int = 0,
        max_ckpt_to_keep: int | None = None,
    ):
        raise NotImplementedError

    # ------------------------------------------------------------------ rotation
    def ensure_checkpoint_capacity(self, max_ckpt_to_keep: int | None) -> None:
        """Before a save: delete the oldest saved folders so that, with the new one, at most
        ``max_ckpt_to_keep`` remain (with 1, the old one stays until the new one is written)."""
        if not max_ckpt_to_keep or max_ckpt_to_keep <= 1:
            return
        excess = len(self.previous_saved_paths) - max_ckpt_to_keep + 1
        if excess > 0:
            self.remove_previous_save_local_path(self.previous_saved_paths[:excess])
            self.previous_saved_paths = self.previous_saved_paths[excess:]

    def register_checkpoint(self, new_path: str, max_ckpt_to_keep: int | None) -> None:
        """After a save: remember ``new_path`` and delete folders beyond the newest ``max_ckpt_to_keep``."""
        self.previous_saved_paths.append(new_path)
        if not max_ckpt_to_keep or max_ckpt_to_keep <= 0:
            return
        excess = len(self.previous_saved_paths) - max_ckpt_to_keep
        if excess > 0:
            self.remove_previous_save_local_path(self.previous_saved_paths[:excess])
            self.previous_saved_paths = self.previous_saved_paths[excess:]

    @staticmethod
    def remove_previous_save_local_path(path: str | list[str]) -> None:
        for folder in [path] if isinstance(path, str) else path:
            logger.info("removing old checkpoint %s", os.path.abspath(folder))
            shutil.rmtree(folder, ignore_errors=True)

    # ------------------------------------------------------------------ RNG
    @staticmethod
    def get_rng_state() -> dict[str, Any]:
        """Python's, numpy's and torch's RNG states (and CUDA's, where there is CUDA)."""
        state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    @staticmethod
    def load_rng_state(rng_state: dict[str, Any]) -> None:
        torch.set_rng_state(rng_state["cpu"])
        np.random.set_state(rng_state["numpy"])
        random.setstate(rng_state["random"])
        if "cuda" in rng_state and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng_state["cuda"])
