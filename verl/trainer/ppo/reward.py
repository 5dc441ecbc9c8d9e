"""Rule rewards at verl's path, ``verl.trainer.ppo.reward``: build the reward manager and score a batch.

* :func:`load_reward_manager` ``(config, tokenizer, num_examine, **reward_kwargs)``: the manager
  ``reward_model.reward_manager`` names (:mod:`verl.workers.reward_manager`).
* :func:`compute_reward` ``(data, reward_fn) -> (reward_tensor, reward_extra_infos_dict)``.
* :func:`compute_reward_async`: the same as a Ray task (``compute_reward_async.remote(data,
  reward_fn=reward_fn)``, then ``ray.get``), for scoring while the driver does something else.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import ray
import torch

from verl.protocol import DataProto
from verl.workers.reward_manager.loader import load_reward_manager, scorer_spec_from_config

__all__ = ["compute_reward", "compute_reward_async", "get_custom_reward_fn", "load_reward_manager"]


def get_custom_reward_fn(config: Any) -> Callable[..., Any] | None:
    """The function ``custom_reward_function.{path,name}`` names, with its ``reward_kwargs`` bound;
    None when no path is set."""
    custom = config.custom_reward_function
    return scorer_spec_from_config(custom).resolve() if custom.path else None


def _takes_return_dict(reward_fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(reward_fn).parameters
    except (TypeError, ValueError):  # no signature to read: try verl's call
        return True
    return "return_dict" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def compute_reward(data: DataProto, reward_fn: Callable[..., Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """``(reward_tensor [B, R], reward_extra_infos_dict)`` of ``reward_fn(data, return_dict=True)``;
    a ``reward_fn`` without ``return_dict`` is called as ``reward_fn(data)`` and gives no extra info.

    Unlike verl, an error inside ``reward_fn`` is not caught and retried without ``return_dict``:
    the managers here already score a failing scorer call 0 and count it (``reward/errors``), so an
    exception that reaches this point is a real fault and is raised."""
    if not _takes_return_dict(reward_fn):
        return reward_fn(data), {}
    result = reward_fn(data, return_dict=True)
    if isinstance(result, Mapping):
        return result["reward_tensor"], dict(result.get("reward_extra_info") or {})
    return result, {}


@ray.remote(num_cpus=1)
def compute_reward_async(
    data: DataProto, config: Any = None, tokenizer: Any = None, reward_fn: Callable[..., Any] | None = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """:func:`compute_reward` in a Ray task. Pass ``reward_fn``; building it from ``config`` and
    ``tokenizer`` instead is deprecated (as in verl) and costs a new manager each call."""
    if reward_fn is None:
        if config is None or tokenizer is None:
            raise ValueError("compute_reward_async needs reward_fn (or, deprecated, config and tokenizer)")
        warnings.warn(
            "compute_reward_async with config and tokenizer is deprecated; pass reward_fn", stacklevel=2
        )
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
    return compute_reward(data, reward_fn)
