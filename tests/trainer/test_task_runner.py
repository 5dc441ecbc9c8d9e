"""verl's way to launch a recipe: a ``TaskRunner`` subclass that brings its own worker, run by
``run_ppo(config, task_runner_class=ray.remote(MyRunner))`` with Hydra's ``DictConfig`` as a verl
recipe's ``main`` has it; and the datasets and sampler verl's runner passes to ``RayPPOTrainer``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import ray
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from torch.utils.data import WeightedRandomSampler

from verl.config.ppo_trainer import CONFIG_DIR, load_config
from verl.single_controller.base.decorator import Dispatch, register
from verl.trainer.main_ppo import TaskRunner, create_rl_dataset, create_rl_sampler, run_ppo
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.workers.fsdp_workers import ActorRolloutRefWorker


def marker_dir() -> Path:
    """Where the recipe's worker leaves its marks: under the cache folder, which the tests' Ray
    workers are given (tests/conftest.py)."""
    return Path(os.environ["VERL_CACHE_DIR"]) / "test_task_runner_markers"


class MarkingWorker(ActorRolloutRefWorker):
    """The recipe's own policy worker: leaves a file per generated batch."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts):
        out = super().generate_sequences(prompts)
        folder = marker_dir()
        (folder / f"gen_{len(list(folder.iterdir()))}_rank{self.rank}").touch()
        return out


# the worker method is registered on the base class; the subclass keeps its dispatch spec
MarkingWorker.generate_sequences.__verl_method_spec__ = (
    ActorRolloutRefWorker.generate_sequences.__verl_method_spec__
)


class MarkingRunner(TaskRunner):
    def add_actor_rollout_worker(self, config):
        _, group_cls = super().add_actor_rollout_worker(config)
        self.role_worker_mapping[next(iter(self.role_worker_mapping))] = ray.remote(MarkingWorker)
        return MarkingWorker, group_cls


STEPS = 2
OVERRIDES = [
    f"trainer.total_training_steps={STEPS}",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[console]",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.rollout.n=2",
]


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_verl_task_runner_subclass_trains_with_its_own_worker(tmp_path):
    markers = marker_dir()
    shutil.rmtree(markers, ignore_errors=True)
    markers.mkdir(parents=True)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(
            # plain Hydra composes verl's defaults; the CPU sizes are the embedded preset
            config_name="ppo_trainer",
            overrides=[*OVERRIDES, "preset=embedded", f"trainer.default_local_dir={tmp_path}/ckpt"],
        )
    run_ppo(cfg, task_runner_class=ray.remote(MarkingRunner))
    assert len(list(markers.iterdir())) == STEPS  # one generated batch per step, by the recipe's worker


@pytest.mark.usefixtures("builtin_assets")
def test_the_trainer_takes_verls_datasets_and_sampler_and_refuses_a_sampler_it_cannot_honour():
    from verl.utils.tokenizer import hf_tokenizer

    config = load_config(OVERRIDES)
    tokenizer = hf_tokenizer(config.actor_rollout_ref.model.path)
    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, True, 24)
    val = create_rl_dataset(config.data.val_files, config.data, tokenizer, None, False, 8)
    trainer = RayPPOTrainer(
        config,
        tokenizer,
        train_dataset=train,
        val_dataset=val,
        train_sampler=create_rl_sampler(config.data, train),
    )
    try:
        assert trainer.train_dataloader.dataset is train and len(trainer.train_dataloader) == 24 // 8
        assert trainer.data.val_dataset is val
    finally:
        trainer.close()
    with pytest.raises(NotImplementedError, match="train_sampler=WeightedRandomSampler"):
        RayPPOTrainer(config, tokenizer, train_sampler=WeightedRandomSampler([1.0] * len(train), 4))
