"""Supervised fine-tuning: cross-entropy on the assistant's tokens of chats (or prompt/response pairs).

One CPU (the embedded default: the built-in tiny model on the built-in arithmetic chats; prints the
validation loss before and after)::

    python -m verl.trainer.sft_trainer

Several processes (GPUs, or CPU ranks over gloo), as in verl::

    torchrun --standalone --nproc_per_node 8 -m verl.trainer.sft_trainer \\
        data.train_files=~/data/gsm8k_sft/train.parquet data.val_files=~/data/gsm8k_sft/test.parquet \\
        model.path=Qwen/Qwen2.5-0.5B-Instruct optim.lr=1e-5 trainer.total_epochs=2 ...

The Megatron engine (GPUs; tensor x pipeline parallel groups, the rest data parallel), as in verl::

    torchrun --standalone --nproc_per_node 8 -m verl.trainer.sft_trainer engine=megatron optim=megatron \\
        engine.tensor_model_parallel_size=2 engine.pipeline_model_parallel_size=2 model.path=... ...

The loop itself (engine, checkpoints, loss) is :mod:`verl.trainer.sft_loop`; the engines and the ranks'
layout :mod:`verl.trainer.sft_parallel`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import hydra
import torch.distributed as dist
from omegaconf import DictConfig

from verl.builtin.assets import prepare_sft_assets
from verl.config.cli import check_argv, user_errors_as_one_line
from verl.config.compat import strip_schema_plus
from verl.config.ppo_trainer import CONFIG_DIR
from verl.config.sft_trainer import SFTTrainerConfig, load_sft_config, to_typed_sft_config
from verl.trainer.sft_loop import SFTTrainer
from verl.trainer.sft_losses import packed_token_losses, token_cross_entropy, token_losses

__all__ = [
    "SFTTrainer",
    "main",
    "packed_token_losses",
    "prepare_sft_argv",
    "run_sft",
    "token_cross_entropy",
    "token_losses",
]


def run_sft(
    config: SFTTrainerConfig,
    trainer_cls: type | None = None,
    prepare_assets: Callable[[Any], None] = prepare_sft_assets,
) -> dict[str, float]:
    """Build the trainer (``trainer_cls``, SFTTrainer by default) from ``config``, train, close; the
    last step's metrics. The validation losses of the run (before training, then each validation)
    are printed at the end.

    ``prepare_assets(config)`` first writes the built-in files and model the config names, on rank 0
    only and before the ranks join: a built-in model's warm-up trains alone in that process."""
    if int(os.environ.get("RANK", "0")) == 0:
        prepare_assets(config)
    trainer = (trainer_cls or SFTTrainer)(config)
    try:
        metrics = trainer.fit()
        if trainer.rank == 0:
            for line in trainer.summary():
                print(line, flush=True)
        return metrics
    finally:
        trainer.close()


def main_with_config(cfg: DictConfig) -> None:
    try:
        run_sft(to_typed_sft_config(cfg))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@hydra.main(config_path="config", config_name="sft_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    with user_errors_as_one_line():
        main_with_config(cfg)


def prepare_sft_argv(
    argv: list[str], config_name: str = "sft_trainer", schema: type | None = None
) -> list[str]:
    """``+key`` for a schema key becomes ``key``; the config is composed (with ``--cfg`` validated)
    before Hydra starts, a mistake in it reported as one line (:func:`verl.config.cli.check_argv`)."""
    schema = schema or SFTTrainerConfig

    def load(overrides: list[str], name: str, directory: str) -> None:
        load_sft_config(overrides, config_dir=directory, config_name=name, schema=schema)

    return check_argv(strip_schema_plus(list(argv), schema), config_name, CONFIG_DIR, load)


if __name__ == "__main__":
    sys.argv[1:] = prepare_sft_argv(sys.argv[1:])
    main()
