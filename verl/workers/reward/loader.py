"""Build the reward manager from the config (verl's ``load_reward_manager``)."""

from __future__ import annotations

import inspect
from typing import Any

from verl.utils.reward_score.scorer_process import ScorerSpec, load_function_from_file
from verl.workers.reward.base import RewardManager
from verl.workers.reward.registry import get_reward_manager_cls

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
) -> RewardManager:
    """The manager ``config.reward_model.reward_manager`` names, scoring with the custom function
    (``config.custom_reward_function``) or the built-in scorers, in a pool sized by
    ``config.reward_model.scoring``. ``reward_kwargs`` (and ``reward_model.reward_kwargs``) go to the
    manager's constructor; a manager that takes ``max_resp_len`` / ``overlong_buffer_cfg`` (dapo)
    gets ``data.max_response_length`` / ``reward_model.overlong_buffer`` unless given."""
    rm_config = config.reward_model
    cls = get_reward_manager_cls(rm_config.reward_manager)
    spec = scorer_spec_from_config(config.custom_reward_function, default_kind=cls.default_kind)
    kwargs = {**dict(rm_config.reward_kwargs or {}), **reward_kwargs}
    params = inspect.signature(cls).parameters
    if "max_resp_len" in params:
        kwargs.setdefault("max_resp_len", config.data.max_response_length)
    if "overlong_buffer_cfg" in params:
        kwargs.setdefault("overlong_buffer_cfg", rm_config.overlong_buffer)
    return cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=spec,
        reward_fn_key=config.data.reward_fn_key,
        num_workers=rm_config.scoring.num_workers,
        timeout_s=rm_config.scoring.timeout_s,
        **kwargs,
    )
