"""Every numeric key of the schema declares the values it accepts, and a value outside them fails at
start-up with an error that names the key, the range and the value."""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from collections.abc import Iterator
from functools import cache

import pytest

from verl.config.algorithm import AlgorithmConfig
from verl.config.base import ANY_NUMBER, RANGE, ConfigError, Range
from verl.config.ppo_trainer import PPOTrainerConfig, load_config
from verl.config.rm_trainer import RMTrainerConfig, load_rm_config
from verl.config.sft_trainer import SFTTrainerConfig, load_sft_config

ROOTS = {"ppo": PPOTrainerConfig, "sft": SFTTrainerConfig, "rm": RMTrainerConfig}

UNBOUNDED = {
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb",  # covariance bounds: any real number
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub",
}
"""The numeric keys for which every value means something (declared ANY_NUMBER)."""


def _members(hint: typing.Any) -> set:
    """The types of a union (``int | None``), else ``{hint}`` (``list[float]`` is a list)."""
    return (
        set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
    )


def _sections(cls: type, prefix: str = "") -> Iterator[tuple[str, type]]:
    """(dotted path, dataclass) of ``cls`` and of every section below it, through the field types
    (so that a section whose default is null, like the SFT model's old ``fsdp_config``, counts too)."""
    yield prefix, cls
    for name, hint in typing.get_type_hints(cls).items():
        for member in _members(hint):
            if isinstance(member, type) and dataclasses.is_dataclass(member):
                yield from _sections(member, f"{prefix}{name}.")


def _numeric_fields(root: type) -> Iterator[tuple[str, dataclasses.Field, bool]]:
    """(full key, field, integer-valued) for every int or float field under ``root``."""
    for prefix, cls in _sections(root):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            values = _members(hints[f.name]) - {type(None)}
            if values and values <= {int, float}:
                yield f"{prefix}{f.name}", f, values == {int}


def _outside(valid: Range, integer: bool) -> float | None:
    """A value of the right type that ``valid`` refuses (None: it accepts every value)."""
    candidates: list[float] = []
    if valid.low is not None:
        candidates += [valid.low - 1, min((*valid.also, valid.low)) - 1, valid.low]
    if valid.high is not None:
        candidates += [valid.high + 1, valid.high]
    if not integer and valid.low is not None:
        candidates.append(valid.low - 0.5)
    for value in candidates:
        value = int(value) if integer else float(value)
        if not valid.contains(value):
            return value
    return None


def _cases() -> list[tuple[str, str, float]]:
    cases = []
    for root, cls in ROOTS.items():
        for key, f, integer in _numeric_fields(cls):
            value = _outside(f.metadata[RANGE], integer) if RANGE in f.metadata else None
            if value is not None and not key.startswith("model.fsdp_config."):  # null in a loaded config
                cases.append((root, key, value))
    return cases


@cache
def _loaded(root: str) -> typing.Any:
    """The root's embedded-default config, loaded as the entry point loads it (interpolations resolved)."""
    return {"ppo": load_config, "sft": load_sft_config, "rm": load_rm_config}[root]([])


def _set(config: typing.Any, key: str, value: typing.Any) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        config = getattr(config, part)
    setattr(config, leaf, value)


@pytest.mark.parametrize("root", sorted(ROOTS))
def test_every_numeric_key_declares_its_range(root):
    missing = [key for key, f, _ in _numeric_fields(ROOTS[root]) if RANGE not in f.metadata]
    assert not missing, (
        "declare the values these keys accept, e.g. `size: int = ranged(8, POSITIVE)` "
        f"(verl/config/base.py): {missing}"
    )


@pytest.mark.parametrize("root", sorted(ROOTS))
def test_only_the_listed_keys_accept_any_number(root):
    unbounded = {key for key, f, _ in _numeric_fields(ROOTS[root]) if f.metadata.get(RANGE) == ANY_NUMBER}
    assert unbounded <= UNBOUNDED


def test_the_walk_finds_the_numeric_keys():
    keys = {root: [key for key, _, _ in _numeric_fields(cls)] for root, cls in ROOTS.items()}
    assert (
        "actor_rollout_ref.model.lora_rank" in keys["ppo"] and "trainer.total_training_steps" in keys["ppo"]
    )
    assert "reward_model.rollout.top_p" in keys["ppo"] and "model.lora_rank" in keys["sft"]
    assert len(keys["ppo"]) > 150 and len(_cases()) > 250


@pytest.mark.parametrize(("root", "key", "value"), _cases(), ids=lambda v: str(v))
def test_a_value_out_of_range_fails_naming_the_key(root, key, value):
    config = copy.deepcopy(_loaded(root))
    config.validate()  # the defaults are valid
    _set(config, key, value)
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: expected .*, got {re.escape(repr(value))}$"):
        config.validate()


def test_the_message_says_the_range_and_the_value():
    with pytest.raises(ConfigError) as lora:
        load_config(["actor_rollout_ref.model.lora_rank=-8"])
    assert str(lora.value) == "actor_rollout_ref.model.lora_rank: expected at least 0, got -8"
    with pytest.raises(ConfigError) as steps:
        load_config(["trainer.total_training_steps=-3"])
    assert str(steps.value) == "trainer.total_training_steps: expected null or at least 1, got -3"
    with pytest.raises(ConfigError, match=r"rollout\.top_p: expected a value in \(0, 1\], got 1\.5"):
        load_config(["actor_rollout_ref.rollout.top_p=1.5"])
    with pytest.raises(ConfigError, match=r"rollout\.top_k: expected -1 or at least 0, got -2"):
        load_config(["actor_rollout_ref.rollout.top_k=-2"])


@pytest.mark.parametrize(
    ("valid", "integer", "text"),
    [
        (Range(low=0, low_open=True), True, "a positive integer"),
        (Range(low=0, low_open=True), False, "a positive number"),
        (Range(low=1, also=(-1,)), True, "-1 or at least 1"),
        (Range(low=0, high=1, low_open=True), False, "a value in (0, 1]"),
        (Range(low=1, low_open=True), False, "more than 1"),
        (ANY_NUMBER, False, "any number"),
    ],
)
def test_a_range_describes_itself(valid, integer, text):
    assert valid.describe(integer) == text


def test_a_section_validated_on_its_own_checks_its_ranges():
    config = AlgorithmConfig()
    config.validate("algorithm")
    config.kl_ctrl.kl_coef = -0.1
    with pytest.raises(ConfigError, match=r"^algorithm\.kl_ctrl\.kl_coef: expected at least 0, got -0\.1$"):
        config.validate("algorithm")


def test_nan_is_out_of_every_bounded_range():
    config = copy.deepcopy(_loaded("ppo"))
    config.algorithm.gamma = float("nan")
    with pytest.raises(ConfigError, match=r"^algorithm\.gamma: expected a value in \[0, 1\], got nan$"):
        config.validate()
