"""The embedded default's model: the tiny Qwen2 of :mod:`verl.builtin.task`, warmed up through the
SFT trainer on first use.

The warm-up is an ordinary SFT run (:class:`~verl.trainer.sft_loop.SFTTrainer`) on chats of the
built-in task, so RL starts with some signal (greedy accuracy about 0.3). It is the same as::

    python -m verl.trainer.sft_trainer model.path=<the freshly initialised model> \\
        data.train_files=<2560 chats of split "sft", seed 1> data.val_files=null data.shuffle=false \\
        optim.lr=1e-3 optim.clip_grad=inf trainer.total_training_steps=40 trainer.device=cpu

(64 chats a step, the cross-entropy of the answer and EOS averaged over the batch's tokens, AdamW
without weight decay or clipping, on the CPU whatever the machine has, so every machine builds the
same model up to its float rounding). The result is saved as a Hugging Face folder under the cache
dir, never half-written.
"""

from __future__ import annotations

import tempfile
from functools import partial
from pathlib import Path

from verl.builtin import task as builtin
from verl.config.actor import TEACHER_MODEL_PATH
from verl.utils.cache import build_model_once, resolve_cache_path

WARMUP_STEPS = 40
WARMUP_BATCH = 64
WARMUP_LR = 1e-3
WARMUP_SEED = 0
"""Seeds the model's initialisation and the trainer; the chats come from the stream of seed + 1."""


TEACHER_STEPS = 160
"""The teacher's warm-up (at TEACHER_MODEL_PATH): four times the student's steps."""


def ensure_builtin_model(path: str) -> None:
    """Create, warm up and save the tiny model (or the built-in teacher) if ``path`` is the built-in
    one and missing."""
    build_model_once(builtin.builtin_model_dir(), path, build_builtin_model, "the built-in tiny model")
    build_model_once(
        resolve_cache_path(TEACHER_MODEL_PATH),
        path,
        partial(build_builtin_model, steps=TEACHER_STEPS),
        "the built-in teacher model",
    )


def build_builtin_model(folder: Path, steps: int = WARMUP_STEPS) -> None:
    """Initialise the tiny model, warm it up with ``steps`` steps of the SFT trainer and save it (with
    its tokenizer) in ``folder``."""
    from verl.builtin.arith import write_arith_warmup_parquet
    from verl.trainer.sft_loop import SFTTrainer

    tokenizer = builtin.build_char_tokenizer()
    with tempfile.TemporaryDirectory(prefix="verl-warmup-") as scratch:
        initial = Path(scratch) / "initial"
        builtin.build_tiny_qwen2(tokenizer, seed=WARMUP_SEED).save_pretrained(initial)
        tokenizer.save_pretrained(initial)
        chats = write_arith_warmup_parquet(scratch, steps * WARMUP_BATCH, seed=WARMUP_SEED + 1)
        config = warmup_config(initial, chats, Path(scratch) / "checkpoints", steps)
        trainer = SFTTrainer(config, distributed=False)
        try:
            trainer.fit()
            trainer.engine.module.save_pretrained(folder)
        finally:
            trainer.close()
    tokenizer.save_pretrained(folder)


def warmup_config(model: Path, chats: Path, checkpoints: Path, steps: int = WARMUP_STEPS):
    """The SFT trainer's config of the warm-up (see the module's doc)."""
    from omegaconf import OmegaConf

    from verl.config.sft_trainer import SFTTrainerConfig, to_typed_sft_config

    settings = {
        "model": {"path": str(model), "enable_gradient_checkpointing": False},
        "data": {
            "train_files": str(chats),
            "val_files": None,
            "train_batch_size": WARMUP_BATCH,
            "micro_batch_size_per_gpu": WARMUP_BATCH,
            "max_length": 16,
            "shuffle": False,
        },
        "optim": {"lr": WARMUP_LR, "weight_decay": 0.0, "clip_grad": float("inf")},
        "trainer": {
            "total_training_steps": steps,
            "seed": WARMUP_SEED,
            "device": "cpu",
            "logger": [],
            "save_freq": -1,
            "val_before_train": False,
            "default_local_dir": str(checkpoints),
        },
    }
    return to_typed_sft_config(OmegaConf.merge(OmegaConf.structured(SFTTrainerConfig), settings))
