"""verl's one-step-off policy trainer: ``python -m verl.experimental.one_step_off_policy.main_ppo``.

The rollout runs on a pool of its own (``rollout.nnodes x rollout.n_gpus_per_node`` beside the
trainer's ``trainer.nnodes x trainer.n_gpus_per_node``) and generates batch s+1 while the actor trains
on batch s, so every batch after the first is one policy version old. This is not a trainer of its
own: the preset ``one_step_off_ppo_trainer.yaml`` configures the asynchronous one (``trainer.mode=async``,
``async_training.max_staleness=1``, ``partial_rollout=False``, the rollout's log-probs as the old
policy's), and everything else (estimators, losses, rewards, checkpoints, validation) is the
synchronous trainer's. verl's one-step-off scripts run unchanged; see docs/async.md.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from verl.config.base import check
from verl.config.cli import prepare_argv, user_errors_as_one_line
from verl.config.compat import refuse_recipe_only_keys
from verl.config.ppo_trainer import CONFIG_DIR, PPOTrainerConfig, to_typed_config
from verl.trainer.main_ppo import run_ppo

CONFIG_NAME = "one_step_off_ppo_trainer"


def check_one_step_off(config: PPOTrainerConfig | DictConfig) -> None:
    """What this entry point needs of the composed config, typed or not (run before the schema's own
    checks, whose message about a synchronous run would not name this entry point)."""
    refuse_recipe_only_keys(config)
    check(
        config.trainer.mode == "async",
        "trainer.mode",
        "async under verl.experimental.one_step_off_policy.main_ppo (for the synchronous trainer run "
        "python -m verl.trainer.main_ppo)",
        config.trainer.mode,
    )


@hydra.main(config_path="../../trainer/config", config_name=CONFIG_NAME, version_base=None)
def main(cfg: DictConfig) -> None:
    with user_errors_as_one_line():
        check_one_step_off(cfg)
        config = to_typed_config(cfg)
        run_ppo(config, list(HydraConfig.get().overrides.task))


if __name__ == "__main__":
    sys.argv[1:] = prepare_argv(sys.argv[1:], CONFIG_NAME, CONFIG_DIR, entry_check=check_one_step_off)
    main()
