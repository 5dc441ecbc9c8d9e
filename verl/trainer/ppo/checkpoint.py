"""Checkpoint layout, the latest-step pointer, rotation, and the driver's own state.

    <trainer.default_local_dir>/
        latest_checkpointed_iteration.txt   # "N": written last, atomically (temp file + rename)
        global_step_N/
            actor/      DCP shards of model + optimizer from every rank, extra_rank_R.pt (LR
                        schedule), worker_rank_R.pt (RNG states, rollout sampler, version),
                        huggingface/ (config + tokenizer; + weights with save_contents hf_model)
            critic/     the same for the critic (PPO with GAE)
            driver.pt   global step, data loader position, KL controller, driver RNGs

A checkpoint is complete only once the pointer names it. A run killed while writing
``global_step_N`` leaves the pointer at the previous step, and resume picks that one; the
partial directory is deleted before step N is written again.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.utils.checkpoint_io import DRIVER_FILE, POINTER_FILE, STEP_DIR, torch_load

logger = logging.getLogger(__name__)


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_pointer(root: str, step: int) -> None:
    atomic_write_bytes(os.path.join(root, POINTER_FILE), f"{step}\n".encode())


def read_pointer(root: str) -> int | None:
    """The step named by the pointer file, or None when there is none yet."""
    path = os.path.join(root, POINTER_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise ValueError(f"{path} should hold one step number, found {text!r}")
    step = int(text)
    if not os.path.isfile(os.path.join(step_dir(root, step), DRIVER_FILE)):
        raise FileNotFoundError(
            f"{path} names step {step}, but {step_dir(root, step)}/{DRIVER_FILE} is missing"
        )
    return step


def resolve_resume_dir(resume_mode: str, root: str, resume_from_path: str | None) -> str | None:
    """``trainer.resume_mode``: the ``global_step_N`` directory to resume from, or None."""
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        path = os.path.abspath(os.path.expanduser(resume_from_path or ""))
        if not STEP_DIR.match(os.path.basename(path)):
            raise ValueError(
                f"trainer.resume_from_path must be a global_step_N directory, got {resume_from_path!r}"
            )
        if not os.path.isfile(os.path.join(path, DRIVER_FILE)):
            raise FileNotFoundError(
                f"trainer.resume_from_path={resume_from_path!r} is not a complete checkpoint "
                f"(no {DRIVER_FILE})"
            )
        return path
    step = read_pointer(root)
    return None if step is None else step_dir(root, step)


def step_of(path: str) -> int:
    match = STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    if match is None:
        raise ValueError(f"{path!r} is not a global_step_N directory")
    return int(match.group(1))


def saved_steps(root: str) -> list[int]:
    if not os.path.isdir(root):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(root) if (m := STEP_DIR.match(name)))


def prepare_step_dir(root: str, step: int) -> str:
    """An empty ``global_step_N`` (a leftover from a save that was cut off is removed)."""
    path = step_dir(root, step)
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def rotate(root: str, role: str, keep: int | None, latest: int) -> list[str]:
    """Delete ``global_step_*/<role>`` beyond the newest ``keep`` complete ones (None or <=0: keep all).

    Only steps at or before ``latest`` (the pointer) are candidates; a step directory left
    with nothing but ``driver.pt`` loses that too, since it can no longer be resumed.
    """
    if keep is None or keep <= 0:
        return []
    complete = [
        s for s in saved_steps(root) if s <= latest and os.path.isdir(os.path.join(step_dir(root, s), role))
    ]
    removed = []
    for step in complete[:-keep]:
        path = os.path.join(step_dir(root, step), role)
        shutil.rmtree(path)
        removed.append(path)
        leftover = set(os.listdir(step_dir(root, step))) - {DRIVER_FILE}
        if not leftover:
            shutil.rmtree(step_dir(root, step))
    return removed


def fault_point(name: str, step: int) -> None:
    """Fault injection for the crash tests: ``VERL_FAULT=<name>@<step>`` SIGKILLs this process here."""
    if os.environ.get("VERL_FAULT") == f"{name}@{step}":
        logger.warning("VERL_FAULT=%s@%d: killing this process", name, step)
        os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------- driver state
def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_driver_state(folder: str, state: dict[str, Any]) -> None:
    """``driver.pt`` (atomic): everything of the driver that decides the following steps."""
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(os.path.join(folder, DRIVER_FILE), buffer.getvalue())


def load_driver_state(folder: str) -> dict[str, Any]:
    """``driver.pt`` of ``folder``; a truncated or corrupt file is an error that names it, its step,
    and the ``resume_from_path`` of the previous complete step."""
    return torch_load(os.path.join(folder, DRIVER_FILE))


# ---------------------------------------------------------------------------- one checkpointer
@dataclass
class Checkpointer:
    """Save and resume a run, the same way for RL and SFT.

    A save writes ``global_step_N/``: each part (``actor``, ``critic``, or the SFT trainer's
    ``model``) through ``write_parts``, then ``driver.pt``, then the pointer (the commit), then
    rotates the parts' older steps. Several processes (SFT under torchrun) all call :meth:`save`;
    ``writer`` is the one that prepares the folder and commits, ``barrier`` keeps them in step.
    """

    root: str
    """``trainer.default_local_dir``."""
    resume_mode: str
    """``trainer.resume_mode``: auto | disable | resume_path."""
    resume_from_path: str | None
    """``trainer.resume_from_path``."""
    world_size: int
    """Ranks of this run; an exact resume needs the ranks that wrote the checkpoint."""
    keep: dict[str, int | None] = field(default_factory=dict)
    """Part -> how many of its latest steps to keep (None: all)."""
    fault: str = "kill_during_save"
    """The fault point between the parts and the commit (``VERL_FAULT=<fault>@<step>``)."""
    writer: bool = True
    barrier: Callable[[], None] = lambda: None

    @classmethod
    def for_run(
        cls, trainer: Any, world_size: int, keep: dict[str, int | None], **options: Any
    ) -> Checkpointer:
        """The checkpointer of a run whose ``trainer`` section (RL or SFT) has ``default_local_dir``,
        ``resume_mode`` and ``resume_from_path``."""
        return cls(
            trainer.default_local_dir,
            trainer.resume_mode,
            trainer.resume_from_path,
            world_size,
            keep,
            **options,
        )

    def save(self, step: int, write_parts: Callable[[str], None], state: dict[str, Any]) -> str:
        """Write step ``step`` (``state``: the driver's, global step, ranks and RNGs added) and commit it."""
        folder = step_dir(self.root, step)
        if self.writer:
            prepare_step_dir(self.root, step)
        self.barrier()
        write_parts(folder)
        self.barrier()
        if self.writer:
            fault_point(self.fault, step)
            state = {**state, "global_steps": step, "world_size": self.world_size, "rng": rng_state()}
            save_driver_state(folder, state)
            write_pointer(self.root, step)
            for part, keep in self.keep.items():
                rotate(self.root, part, keep, step)
            logger.info("saved checkpoint %s", folder)
        self.barrier()
        return folder

    def resume(self) -> tuple[str, dict[str, Any]] | None:
        """The folder to resume from and its driver state, as ``resume_mode`` says; None to start afresh."""
        folder = resolve_resume_dir(self.resume_mode, self.root, self.resume_from_path)
        if folder is None:
            return None
        state = load_driver_state(folder)
        saved_ranks = state.get("world_size", self.world_size)
        if saved_ranks != self.world_size:
            raise ValueError(
                f"{folder} was written by {saved_ranks} ranks but this run has {self.world_size} "
                "(trainer.nnodes x trainer.n_gpus_per_node, or torchrun's processes); exact resume needs "
                "the same number. To continue from its weights on another layout, export them with "
                "`python -m verl.model_merger merge` and start a new run from that model"
            )
        return folder, state
