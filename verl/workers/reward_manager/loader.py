"""Build the reward manager from the config (verl's ``load_reward_manager``; verl's import path for
it is :mod:`verl.trainer.ppo.reward`)."""

from __future__ import annotations

import inspect
from typing import Any

from verl.utils.reward_score.scorer_process import ScorerSpec, load_function_from_file
from verl.workers.reward_manager.abstract import AbstractRewardManager
from verl.workers.reward_manager.base import RewardManager
from verl.workers.reward_manager.registry import get_reward_manager_cls

__all__ = ["load_reward_manager", "scorer_spec_from_config"]


def scorer_spec_from_config(custom_reward_function: Any, default_kind: str = "default") -> ScorerSpec:
    """The scorer named by ``custom_reward_function.{path,name,reward_kwargs}``, or the built-in
    one. A custom function is imported here once, so a bad path or name fails before training."""
    path = custom_reward_function.path
    if not path:
        return ScorerSpec(kind=default_kind)
    load_function_from_file(path, custom_reward_function.name)
    return ScorerSpec(
        kind="file",
        path=path,
        name=custom_reward_function.name,
        kwargs=dict(custom_reward_function.reward_kwargs or {}),
    )


def load_reward_manager(
    config: Any, tokenizer: Any, num_examine: int = 0, **reward_kwargs: Any
) -> AbstractRewardManager:
    """The manager ``config.reward_model.reward_manager`` names, scoring with the custom function
    (``config.custom_reward_function``) or the built-in scorers. ``reward_kwargs`` (and
    ``reward_model.reward_kwargs``) go to the manager's constructor.

    A manager of this project (a :class:`RewardManager`) gets the scorer as a :class:`ScorerSpec`
    and the scoring pool's size and timeout (``reward_model.scoring``); one written against verl's
    interface gets the scorer as a plain function, and the pool settings only if its constructor
    names them. A constructor that names ``max_resp_len`` / ``overlong_buffer_cfg`` (dapo) gets
    ``data.max_response_length`` / ``reward_model.overlong_buffer`` unless given."""
    rm_config = config.reward_model
    cls = get_reward_manager_cls(rm_config.reward_manager)
    ours = issubclass(cls, RewardManager)
    spec = scorer_spec_from_config(config.custom_reward_function, getattr(cls, "default_kind", "default"))
    kwargs = {**dict(rm_config.reward_kwargs or {}), **reward_kwargs}
    params = inspect.signature(cls).parameters
    optional = {
        "num_workers": rm_config.scoring.num_workers,
        "timeout_s": rm_config.scoring.timeout_s,
        "max_resp_len": config.data.max_response_length,
        "overlong_buffer_cfg": rm_config.overlong_buffer,
    }
    for name, value in optional.items():
        if name in params or (ours and name in ("num_workers", "timeout_s")):
            kwargs.setdefault(name, value)
    return cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=spec if ours else spec.resolve(),
        reward_fn_key=config.data.reward_fn_key,
        **kwargs,
    )
