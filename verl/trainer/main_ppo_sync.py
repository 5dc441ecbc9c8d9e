"""verl's explicit synchronous entry point: ``python -m verl.trainer.main_ppo_sync``.

The same run as ``python -m verl.trainer.main_ppo`` with ``trainer.mode=sync`` (its default): the
same preset (``ppo_trainer.yaml``, or ``--config-name``/``--config-path``), keys and synchronous
trainer. ``trainer.mode=async`` is refused in one line naming this entry point, as verl's
asynchronous entry points refuse the synchronous mode.

One CPU (the embedded default)::

    python -m verl.trainer.main_ppo_sync

One GPU, or a cluster: the arguments of ``main_ppo`` (see its module doc string), e.g.::

    python -m verl.trainer.main_ppo_sync data.train_files=~/data/gsm8k/train.parquet \\
        actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=1 ...
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from verl.config.base import check
from verl.config.cli import prepare_argv, user_errors_as_one_line
from verl.config.compat import refuse_recipe_only_keys
from verl.config.ppo_trainer import CONFIG_DIR, to_typed_config
from verl.trainer.main_ppo import run_ppo

ENTRY = "verl.trainer.main_ppo_sync"


def check_sync_entry(config: Any) -> None:
    """What this entry point needs of the composed config, typed or not (checked before the
    schema's own rules, whose messages about an asynchronous run would not name it)."""
    refuse_recipe_only_keys(config)
    check(
        config.trainer.mode == "sync",
        "trainer.mode",
        f"sync under {ENTRY} (for the asynchronous trainer run python -m verl.trainer.main_ppo "
        "trainer.mode=async)",
        config.trainer.mode,
    )


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    with user_errors_as_one_line():
        check_sync_entry(cfg)
        run_ppo(to_typed_config(cfg), list(HydraConfig.get().overrides.task))


if __name__ == "__main__":
    sys.argv[1:] = prepare_argv(sys.argv[1:], "ppo_trainer", CONFIG_DIR, entry_check=check_sync_entry)
    main()
