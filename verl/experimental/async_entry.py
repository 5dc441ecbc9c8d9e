"""The plumbing shared by verl's asynchronous entry points (one-step-off, fully async): each is the
asynchronous trainer (``trainer.mode=async``) under a preset of its own, so each only names its
preset and refuses the synchronous mode in one line, naming itself."""

from __future__ import annotations

import sys
from functools import partial

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from verl.config.base import check
from verl.config.cli import prepare_argv, user_errors_as_one_line
from verl.config.compat import refuse_recipe_only_keys
from verl.config.ppo_trainer import CONFIG_DIR, PPOTrainerConfig, to_typed_config
from verl.trainer.main_ppo import run_ppo


def check_async_entry(config: PPOTrainerConfig | DictConfig, entry: str) -> None:
    """What an asynchronous entry point needs of the composed config, typed or not (run before the
    schema's own checks, whose message about a synchronous run would not name the entry point)."""
    refuse_recipe_only_keys(config)
    check(
        config.trainer.mode == "async",
        "trainer.mode",
        f"async under {entry} (for the synchronous trainer run python -m verl.trainer.main_ppo)",
        config.trainer.mode,
    )


def run_async_entry(config_name: str, entry: str) -> None:
    """``python -m <entry>``: compose ``config_name`` (or ``--config-name``) with the command line,
    check it, train."""
    entry_check = partial(check_async_entry, entry=entry)
    sys.argv[1:] = prepare_argv(sys.argv[1:], config_name, CONFIG_DIR, entry_check=entry_check)

    @hydra.main(config_path="../trainer/config", config_name=config_name, version_base=None)
    def main(cfg: DictConfig) -> None:
        with user_errors_as_one_line():
            entry_check(cfg)
            config = to_typed_config(cfg)
            run_ppo(config, list(HydraConfig.get().overrides.task))

    main()
