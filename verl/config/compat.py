"""verl's scripts, unchanged: keys this project converts, refuses, and ``+key=`` additions.

Every key of the schema takes effect, is refused at start-up with a message, or is listed once in
the log as inert (``ALWAYS_INERT_KEYS`` / ``GPU_ONLY_KEYS`` / ``ENGINE_ONLY_KEYS`` in
``ppo_trainer.py``); a test walks the schema to keep it so. This module holds the other two lists:

* :data:`CONVERTED_KEYS`: deprecated or alternative spellings that are rewritten at start-up onto
  the key this project reads, as verl itself does (the global micro-batch sizes, verl 0.9's
  ``reward.*`` block, ``optim.clip_grad`` and ``optim.warmup_style``). :func:`convert_verl_keys`
  applies them and returns one note per conversion.
* :data:`REFUSED_KEYS`: keys that must keep one value here, each with what to use instead.

``+key=value`` (Hydra's "add a key") is how verl scripts pass keys verl's YAML lacks. For a key
this schema has, :func:`normalize_overrides` turns it into ``key=value``; a ``+key`` the schema
does not have is an error that names it (:func:`check_known_keys`), never silently dropped.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from omegaconf import DictConfig

from verl.config.async_training import convert_async_keys
from verl.config.base import ConfigError, check
from verl.config.keypaths import get_key, is_schema_key, set_key, within_schema
from verl.config.verl_extras import route_override

__all__ = [
    "CONVERTED_KEYS",
    "MICRO_BATCH_KEYS",
    "RECIPE_ONLY_KEYS",
    "REFUSED_KEYS",
    "check_known_keys",
    "convert_verl_keys",
    "normalize_overrides",
    "refuse_recipe_only_keys",
    "refuse_unsupported",
]

# deprecated global micro-batch size -> the per-rank key the workers read (verl's fsdp_workers
# divide the global one by the data-parallel size; unlike ppo_mini_batch_size, which counts
# prompts and is multiplied by rollout.n, micro-batches count rows and are not)
MICRO_BATCH_KEYS = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size": "critic.forward_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size": "reward_model.micro_batch_size_per_gpu",
}
# verl 0.9's reward block and verl 0.8's reward_model.num_workers -> the key read here
REWARD_ALIASES = {
    "reward.num_workers": "reward_model.scoring.num_workers",
    "reward_model.num_workers": "reward_model.scoring.num_workers",
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.reward_model.enable_resource_pool": "reward_model.enable_resource_pool",
    "reward.reward_model.n_gpus_per_node": "reward_model.n_gpus_per_node",
    "reward.reward_model.nnodes": "reward_model.nnodes",
}
# verl's other optimizer spellings -> (the key read here, the alias's default, the key's default). An
# alias set away from its default is converted; set together with the key to another value, refused
OPTIM_ALIASES: dict[str, tuple[str, Any, Any]] = {
    "actor_rollout_ref.actor.optim.clip_grad": ("actor_rollout_ref.actor.grad_clip", 1.0, 1.0),
    "critic.optim.clip_grad": ("critic.grad_clip", 1.0, 1.0),
    "actor_rollout_ref.actor.optim.warmup_style": (
        "actor_rollout_ref.actor.optim.lr_scheduler_type",
        None,
        "constant",
    ),
    "critic.optim.warmup_style": ("critic.optim.lr_scheduler_type", None, "constant"),
}
# verl 0.9's engine spelling of a role's Ulysses size -> the role's key, which the workers read here
# (verl's role key is the deprecated one: its value, when above 1, is copied onto the engine's)
SP_ALIASES = {
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    ),
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": (
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size"
    ),
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": "critic.ulysses_sequence_parallel_size",
}
CONVERTED_KEYS: dict[str, str] = {
    **{k: f"{v} = {k.rsplit('.', 1)[1]} // (nnodes x n_gpus_per_node)" for k, v in MICRO_BATCH_KEYS.items()},
    **{alias: f"{target} (when above 1)" for alias, target in SP_ALIASES.items()},
    **REWARD_ALIASES,
    **{alias: target for alias, (target, _, _) in OPTIM_ALIASES.items()},
    "reward.custom_reward_function.reward_kwargs": "custom_reward_function.reward_kwargs (merged)",
    "reward.reward_kwargs": "reward_model.reward_kwargs (merged)",
    "rollout.n_gpus_per_node": "async_training.rollout_n_gpus",
    "rollout.nnodes": "checked equal to trainer.nnodes (the rollout pool spans the trainer's nodes)",
}

_REGISTER_ONLY = (
    "reward managers are looked up by name: register yours with @register_reward_manager in a module "
    "imported through actor_rollout_ref.model.external_lib, then set reward_model.reward_manager"
)
_NO_SP = (
    "the reward model has no sequence parallelism (the actor's and the critic's have: "
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size, critic.ulysses_sequence_parallel_size)"
)
# key -> (the one accepted value, why / what to use instead)
REFUSED_KEYS: dict[str, tuple[Any, str]] = {
    "actor_rollout_ref.rollout.server.url": (
        None,
        "an external rollout server is not wired yet; actor_rollout_ref.rollout.mode=async starts a server "
        "on every rollout rank",
    ),
    "actor_rollout_ref.rollout.multi_turn.function_tool_path": (
        None,
        "Python-function tools are not supported yet; write a verl.tools.base_tool.BaseTool and list it in "
        "multi_turn.tool_config_path",
    ),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": (None, "not supported yet; use rollout.n"),
    "reward_model.ulysses_sequence_parallel_size": (1, _NO_SP),
    "reward_model.model.fsdp_config.ulysses_sequence_parallel_size": (1, _NO_SP),
    "reward_model.reward_loop_source": ("register", _REGISTER_ONLY),
    "reward.reward_manager.source": ("register", _REGISTER_ONLY),
    "trainer.default_hdfs_dir": (
        None,
        "HDFS is not supported; checkpoints stay in trainer.default_local_dir",
    ),
    "trainer.del_local_ckpt_after_load": (
        False,
        "without a remote copy (trainer.default_hdfs_dir) the local checkpoint is the only one",
    ),
}
# keys only a recipe's driver reads: refused under verl.trainer.main_ppo (key -> where it works)
RECIPE_ONLY_KEYS: dict[str, str] = {
    "algorithm.filter_groups.enable": (
        "DAPO's dynamic sampling runs in its own driver: python -m recipe.dapo.main_dapo (see recipe/dapo)"
    ),
}


# ---------------------------------------------------------------------------- dotted access
# ---------------------------------------------------------------------------- overrides
_APPEND = re.compile(r"^\+(?!\+)([^=~+][^=]*)=(.*)$", re.DOTALL)
_PLAIN = re.compile(r"^([^=~+][^=]*)=(.*)$", re.DOTALL)


def normalize_overrides(overrides: list[str], schema: type) -> list[str]:
    """``+key=value`` -> ``key=value`` when the schema has ``key`` (verl scripts add keys verl's
    YAML lacks with ``+``; here they may already exist); ``key=value`` inside a free-form dict of the
    schema (``rollout.engine_kwargs.sglang.attention_backend``) -> ``++key=value``, added or replaced
    whether or not the dict has it yet; a key of verl 0.9.1 the schema lacks ->
    ``++verl_extras.key=value`` (:mod:`verl.config.verl_extras`). Other arguments are unchanged."""
    out = []
    for arg in overrides:
        match = _APPEND.match(arg)
        if match and is_schema_key(schema, match.group(1)):
            arg = f"{match.group(1)}={match.group(2)}"
        plain = _PLAIN.match(arg)
        if plain and within_schema(schema, plain.group(1)) and not is_schema_key(schema, plain.group(1)):
            arg = f"++{arg}"
        out.append(route_override(arg, schema))
    return out


def strip_schema_plus(overrides: list[str], schema: type) -> list[str]:
    """``+key=value`` -> ``key=value`` when ``schema`` has ``key`` (verl scripts add keys with ``+``
    that verl's YAML lacks); other arguments are unchanged (an unknown key stays an error)."""
    out = []
    for arg in overrides:
        match = _APPEND.match(arg)
        out.append(
            f"{match.group(1)}={match.group(2)}" if match and is_schema_key(schema, match.group(1)) else arg
        )
    return out


def check_known_keys(cfg: DictConfig, path: str = "") -> None:
    """Fail on a key that ``+key=value`` added to a section of the schema (OmegaConf would carry
    it along and nothing would read it)."""
    schema = cfg._metadata.object_type
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return  # a free-form dict (override_config, engine_kwargs, reward_kwargs, ...)
    names = {f.name for f in dataclasses.fields(schema)}
    for key in cfg.keys():
        full = f"{path}{key}"
        if key not in names:
            raise ConfigError(
                f"{full}: unknown key (added with +{full}=...); this project does not read it. "
                "Remove it, or see `python -m verl.trainer.main_ppo --cfg job` for the keys it knows"
            )
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            check_known_keys(child, f"{full}.")


# ---------------------------------------------------------------------------- conversions
def convert_verl_keys(config: Any) -> list[str]:
    """Rewrite the keys of :data:`CONVERTED_KEYS` onto the keys this project reads (in place);
    returns one note per conversion for the start-up log."""
    notes = _convert_micro_batch_sizes(config)
    notes += _convert_reward_aliases(config)
    notes += _convert_reward_kwargs(config)
    notes += _convert_optim_aliases(config)
    notes += _convert_sequence_parallel(config)
    notes += convert_async_keys(config)
    return notes


def _convert_micro_batch_sizes(config: Any) -> list[str]:
    world = config.trainer.n_gpus_per_node * config.trainer.nnodes
    notes = []
    for global_key, per_gpu_key in MICRO_BATCH_KEYS.items():
        value = get_key(config, global_key)
        if value is None:
            continue
        check(
            isinstance(value, int) and value >= world,
            global_key,
            f"at least the {world} ranks (nnodes x n_gpus_per_node) it is divided over, or use {per_gpu_key}",
            value,
        )
        before = get_key(config, per_gpu_key)
        set_key(config, per_gpu_key, value // world)
        replaced = f", replacing {before}" if before not in (None, value // world) else ""
        notes.append(
            f"{global_key}={value} -> {per_gpu_key}={value // world} ({value} // {world} ranks{replaced})"
        )
    return notes


def _convert_reward_aliases(config: Any) -> list[str]:
    notes = []
    defaults = type(config)()  # the schema's own defaults: an alias may replace a key left at its default
    for alias, target in REWARD_ALIASES.items():
        value = get_key(config, alias)
        if value is None:
            continue
        current = get_key(config, target)
        other = [k for k, t in REWARD_ALIASES.items() if t == target and k != alias]
        check(
            all(get_key(config, k) in (None, value) for k in other),
            alias,
            f"the same value as {', '.join(other)} (both set {target})",
            value,
        )
        check(
            current in (value, get_key(defaults, target), None)
            or target == "reward_model.scoring.num_workers",
            alias,
            f"the same value as {target}={current!r} (both spellings are set)",
            value,
        )
        set_key(config, target, value)
        notes.append(f"{alias}={value!r} -> {target}")
    for alias, target in (
        ("reward.custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs"),
        ("reward.reward_kwargs", "reward_model.reward_kwargs"),
    ):
        extra = dict(get_key(config, alias) or {})
        if extra:
            merged = dict(get_key(config, target) or {})
            clash = [k for k in extra if k in merged and merged[k] != extra[k]]
            check(not clash, f"{alias}.{clash[0] if clash else ''}", f"the same value as in {target}", extra)
            set_key(config, target, {**merged, **extra})
            notes.append(f"{alias} -> {target} ({', '.join(sorted(extra))})")
    return notes


def _convert_reward_kwargs(config: Any) -> list[str]:
    """verl's DAPO scripts pass the overlong buffer as ``reward_kwargs.overlong_buffer_cfg.*``."""
    kwargs = config.reward_model.reward_kwargs
    if not kwargs or "overlong_buffer_cfg" not in kwargs:
        return []
    given = dict(kwargs.pop("overlong_buffer_cfg") or {})
    buffer = config.reward_model.overlong_buffer
    names = {f.name for f in dataclasses.fields(buffer)}
    for key, value in given.items():
        check(
            key in names,
            f"reward_model.reward_kwargs.overlong_buffer_cfg.{key}",
            f"one of {sorted(names)}",
            key,
        )
        setattr(buffer, key, value)
    return [f"reward_model.reward_kwargs.overlong_buffer_cfg -> reward_model.overlong_buffer ({given})"]


def _convert_optim_aliases(config: Any) -> list[str]:
    """``optim.clip_grad`` -> ``grad_clip``, ``optim.warmup_style`` -> ``optim.lr_scheduler_type``."""
    notes = []
    for alias, (target, alias_default, target_default) in OPTIM_ALIASES.items():
        value, current = get_key(config, alias), get_key(config, target)
        if value in (alias_default, current):
            if alias_default is not None:  # only the key read here was set: the alias follows it
                set_key(config, alias, current)
            continue
        check(
            current == target_default,
            alias,
            f"the same value as {target}={current!r} (both spellings are set)",
            value,
        )
        set_key(config, target, value)
        notes.append(f"{alias}={value!r} -> {target}")
    return notes


def _convert_sequence_parallel(config: Any) -> list[str]:
    """``fsdp_config.ulysses_sequence_parallel_size`` (verl 0.9's spelling) above 1 -> the role's key.
    The reference runs in the actor's process groups, so it follows an actor size converted here
    unless it was given a size of its own; the engine spelling then mirrors the size in effect (a
    value below 1 is left for the range check to name)."""
    ref = "actor_rollout_ref.ref.ulysses_sequence_parallel_size"
    notes = []
    for alias, target in SP_ALIASES.items():
        value, current = get_key(config, alias), get_key(config, target)
        if value < 1 or value == current:
            continue
        if value > 1:
            check(
                current == 1, alias, f"the same value as {target}={current} (both spellings are set)", value
            )
            set_key(config, target, value)
            notes.append(f"{alias}={value} -> {target}")
            if alias.startswith("actor_rollout_ref.actor.") and get_key(config, ref) == current:
                set_key(config, ref, value)
        set_key(config, alias, get_key(config, target))
    return notes


# ---------------------------------------------------------------------------- refusals
def refuse_unsupported(config: Any) -> None:
    """Raise a ConfigError naming the first key of :data:`REFUSED_KEYS` that has another value."""
    for key, (accepted, reason) in REFUSED_KEYS.items():
        value = get_key(config, key)
        check(value == accepted, key, f"{accepted!r} ({reason})", value)


def refuse_recipe_only_keys(config: Any) -> None:
    """Under ``verl.trainer.main_ppo``: a key only a recipe's driver reads must keep its default."""
    for key, where in RECIPE_ONLY_KEYS.items():
        value = get_key(config, key)
        check(not value, key, f"False with verl.trainer.main_ppo ({where})", value)
