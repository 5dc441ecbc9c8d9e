"""What a recipe written for verl finds on the trainer besides the loop's own phases: verl's
constructor arguments checked and its ``checkpoint_manager`` (the weight sync as an object).
"""

from __future__ import annotations

import logging
from typing import Any

from torch.utils.data import RandomSampler, SequentialSampler

from verl.single_controller.ray import RayWorkerGroup

logger = logging.getLogger(__name__)

__all__ = ["RolloutWeights", "check_data_sources", "refuse_unsupported_arguments"]


def refuse_unsupported_arguments(ray_worker_group_cls: type, train_sampler: Any, shuffle: bool) -> None:
    """verl's constructor arguments that could not take effect here are refused, naming the argument.

    ``train_sampler``: the loader keeps its own seeded order (so a resume continues exactly), which is
    what verl's ``create_rl_sampler`` asks for (random with ``data.shuffle``, else in order); any other
    sampler (a curriculum) is refused."""
    if ray_worker_group_cls is not RayWorkerGroup:
        raise NotImplementedError(
            f"RayPPOTrainer(ray_worker_group_cls={ray_worker_group_cls.__name__}): only RayWorkerGroup "
            "builds the worker groups here; customise the workers through role_worker_mapping instead"
        )
    if train_sampler is None:
        return
    expected = RandomSampler if shuffle else SequentialSampler
    if not isinstance(train_sampler, expected):
        raise NotImplementedError(
            f"RayPPOTrainer(train_sampler={type(train_sampler).__name__}): with data.shuffle={shuffle} the "
            f"loader's own seeded order stands for a {expected.__name__} (verl's create_rl_sampler); "
            "other samplers are not supported"
        )


def check_data_sources(reward_fn: Any, dataset: Any) -> None:
    """The project's reward managers check up front that a scorer exists for every ``data_source`` of
    the dataset; a recipe's own reward function (or dataset) is trusted."""
    check = getattr(reward_fn, "check_data_sources", None)
    if check is not None and hasattr(dataset, "data_source_locations"):
        check(dataset.data_source_locations())


class RolloutWeights:
    """verl's ``trainer.checkpoint_manager``: ``update_weights()`` sends the actor's weights to the
    rollout as the next policy version (the trainer's :meth:`sync_weights` phase); ``sleep_replicas()``
    frees the engines' memory between generations, which the project's rollouts already do after each
    batch."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    def update_weights(self) -> dict[str, float]:
        return self._trainer.sync_weights()

    def sleep_replicas(self) -> None:
        """Nothing to do: a colocated engine sleeps after every batch it generates."""
