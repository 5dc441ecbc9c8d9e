"""Train a policy with PPO/GRPO: parse the config, build the trainer, fit, close.

One CPU (the embedded default: GRPO on a built-in arithmetic task with a tiny model)::

    python -m verl.trainer.main_ppo

One GPU::

    python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\
        data.train_files=~/data/gsm8k/train.parquet data.val_files=~/data/gsm8k/test.parquet \\
        actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=1 ...

A cluster: start Ray on every node, then add ``ray_init.address=auto trainer.nnodes=N``.
``--cfg job`` validates and prints the resolved config; an unknown key is an error that names it.
verl's scripts run unchanged: deprecated keys are converted, inert ones listed in the log, and
unsupported ones refused with a message (``verl/config/compat.py``).
"""

from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from verl.builtin.assets import is_builtin_model, prepare_ppo_assets
from verl.config.cli import prepare_argv, user_errors_as_one_line
from verl.config.compat import refuse_recipe_only_keys
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import CONFIG_DIR, PPOTrainerConfig, to_typed_config
from verl.single_controller import WorkerGroupError
from verl.trainer import preflight
from verl.trainer.ppo import builders
from verl.trainer.task_runner import TaskRunner, create_rl_dataset, create_rl_sampler

__all__ = ["TaskRunner", "create_rl_dataset", "create_rl_sampler", "main", "run_ppo"]

logger = logging.getLogger(__name__)


def run_ppo(
    config: PPOTrainerConfig | DictConfig,
    overrides: list[str] | None = None,
    trainer_cls: type | None = None,
    task_runner_class: type | None = None,
) -> dict[str, float]:
    """Build everything from ``config``, train, and always tear the workers down.

    ``trainer_cls`` is how a recipe brings its own driver (a subclass of ``RayPPOTrainer``);
    by default ``trainer.mode`` picks the synchronous or the asynchronous trainer.
    ``task_runner_class`` is verl's way: a :class:`TaskRunner` subclass (or ``ray.remote`` of one)
    that builds and runs the trainer itself, here in this process. ``config`` may be Hydra's
    ``DictConfig`` (a verl recipe's ``main``); it is typed and validated first.

    A worker that dies or hangs fails the run with an error naming role, rank, method and
    phase, unless ``trainer.max_restarts`` allows rebuilding the workers and resuming from the
    last checkpoint (not with a task runner, which owns its trainer).
    """
    from verl.trainer.ppo.async_trainer import AsyncPPOTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    given = config  # a task runner gets the config as given: verl's runners read a DictConfig
    config = config if isinstance(config, PPOTrainerConfig) else to_typed_config(config)
    if trainer_cls is None and task_runner_class is None:  # a recipe's driver reads its own keys
        refuse_recipe_only_keys(config)
        trainer_cls = AsyncPPOTrainer if config.trainer.mode == "async" else RayPPOTrainer

    prepare_ppo_assets(config)
    preflight.check_before_ray(config)
    builders.init_ray(config)
    preflight.check_after_ray(config)
    builtin_model = is_builtin_model(config.actor_rollout_ref.model.path)
    log_config_notes(config, builders.resolve_device(config), overrides or [], builtin_model)
    try:
        if task_runner_class is not None:
            getattr(task_runner_class, "__ray_actor_class__", task_runner_class)().run(given)
            return {}
        return _fit_with_restarts(config, trainer_cls)
    finally:
        builders.write_ray_timeline(config)


def _fit_with_restarts(config: PPOTrainerConfig, trainer_cls: type) -> dict[str, float]:
    max_restarts = config.trainer.max_restarts
    for attempt in range(max_restarts + 1):
        trainer = trainer_cls(config)
        try:
            trainer.init_workers()
            return trainer.fit()
        except WorkerGroupError as error:
            if attempt == max_restarts:
                raise
            logger.warning(
                "restart %d/%d after a worker failure (%s): rebuilding the worker groups and resuming "
                "from the last checkpoint in %s",
                attempt + 1,
                max_restarts,
                " ".join(
                    [
                        f"{type(error).__name__}: {str(error).splitlines()[0]}",
                        *getattr(error, "__notes__", []),
                    ]
                ),
                config.trainer.default_local_dir,
            )
            config.trainer.resume_mode = "auto"
        finally:
            trainer.close()
    raise AssertionError("unreachable")


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    with user_errors_as_one_line():
        run_ppo(to_typed_config(cfg), list(HydraConfig.get().overrides.task))


if __name__ == "__main__":
    sys.argv[1:] = prepare_argv(sys.argv[1:], "ppo_trainer", CONFIG_DIR, entry_check=refuse_recipe_only_keys)
    main()
