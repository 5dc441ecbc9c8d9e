"""Every key of the schema takes effect, is refused at start-up, is converted, or is listed as inert.

"Takes effect" is checked the way a reader would grep: the key's name is read as an attribute (or
named as a string, for ``getattr``; doc strings do not count) in a file of ``verl/`` or ``recipe/``
outside the schema (``verl/config/``), in a file whose text also names the key's section
(its field name or its dataclass), so that ``filter_groups.enable`` is not satisfied by some other
``.enable``. A key only the schema reads must be in one of the lists of ``compat.py`` or
``inert.py``; a new key that nothing reads fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from functools import cache
from pathlib import Path

import pytest

from verl.config import compat
from verl.config.base import ConfigError
from verl.config.fully_async import FULLY_ASYNC_ONLY
from verl.config.fully_async import INERT_KEYS as FULLY_ASYNC_INERT_KEYS
from verl.config.inert import (
    ALWAYS_INERT_KEYS,
    ENGINE_ONLY_KEYS,
    GPU_ONLY_KEYS,
    JUDGE_INERT_KEYS,
    SERVER_ONLY_KEYS,
)
from verl.config.megatron import INERT_KEYS as MEGATRON_INERT_KEYS
from verl.config.megatron import NOT_YET, SECTIONS
from verl.config.ppo_trainer import PPOTrainerConfig, load_config
from verl.config.rollout import RolloutConfig

REPO = Path(__file__).resolve().parents[3]
SCHEMA_DIR = REPO / "verl" / "config"
INERT = (
    *ALWAYS_INERT_KEYS,
    *GPU_ONLY_KEYS,
    *ENGINE_ONLY_KEYS,
    *SERVER_ONLY_KEYS,
    *JUDGE_INERT_KEYS,
    *MEGATRON_INERT_KEYS,
    *FULLY_ASYNC_INERT_KEYS,
)
# the Megatron keys whose feature the engine lacks: refused away from their default (verl/config/megatron.py)
MEGATRON_REFUSED = tuple(f"{section}.{name}" for section in SECTIONS for name in NOT_YET)
# Keys whose effect is written but not yet called from a file this change may not edit; each entry
# says what is missing. The test fails once the key is read, so the entry gets removed then.
PENDING_CALLS: dict[str, str] = {}
# verl 0.9.1's other keys, as given: each is converted, refused or noted by the schema's own
# start-up check (verl/config/verl_extras.py, tested in test_verl_extras.py)
SCHEMA_CHECKED = (
    "verl_extras",
    # True is required with trainer.mode=sync; with async the rollout has its own pool either way
    # (verl/config/async_training.py: check_hybrid_engine; tests/trainer/config/test_one_step_off.py)
    "actor_rollout_ref.hybrid_engine",
    # read by teacher_plan (verl/config/distillation.py), which places the teachers (builders.py)
    "distillation.teacher_models",
    # only verl's one value, vanilla, is accepted (DistillationLossConfig.validate)
    "distillation.distillation_loss.policy_loss_mode",
    # verl's fully-async keys: converted onto the async trainer's, or refused
    # (verl/config/fully_async.py; tests/trainer/test_fully_async.py)
    *FULLY_ASYNC_ONLY,
    "async_training.staleness_threshold",
    "async_training.use_dynamic_resource_scheduling",
    # read by units_per_step (verl/config/async_training.py), which the async trainer streams by, and
    # noted inert where it streams nothing (tests/trainer/ppo/test_sample_stream.py)
    "data.gen_batch_size",
)
# Keys that take effect through a property of the schema which the trainer reads (key -> property).
READ_THROUGH_PROPERTIES = {
    "critic.enable": (PPOTrainerConfig, "use_critic"),
    "actor_rollout_ref.rollout.multi_turn.enable": (RolloutConfig, "uses_agent_loop"),
}


def _leaves(cls: type, prefix: str = "", section: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """(dotted key, names of its section: field name and dataclass name) for every leaf."""
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            out += _leaves(type(default), f"{prefix}{f.name}.", (f.name, type(default).__name__))
        else:
            out.append((f"{prefix}{f.name}", section or ("PPOTrainerConfig",)))
    return out


@cache
def _sources() -> list[tuple[set[str], str]]:
    """Per source file outside the schema: (attribute names and exact strings read, its text)."""
    out = []
    for path in [*REPO.joinpath("verl").rglob("*.py"), *REPO.joinpath("recipe").rglob("*.py")]:
        if SCHEMA_DIR in path.parents:
            continue
        text = path.read_text()
        reads = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute):
                reads.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                reads.add(node.value)
        out.append((reads, text))
    return out


def _is_read(key: str, section: tuple[str, ...]) -> bool:
    leaf = key.rsplit(".", 1)[-1]
    return any(leaf in reads and any(s in text for s in section) for reads, text in _sources())


def _listed(key: str, keys: tuple[str, ...] | dict) -> bool:
    return any(key == k or key.startswith(k + ".") for k in keys)


def test_every_schema_key_is_read_refused_converted_or_inert():
    unaccounted = [
        key
        for key, section in _leaves(PPOTrainerConfig)
        if key not in PENDING_CALLS
        and key not in SCHEMA_CHECKED
        and key not in READ_THROUGH_PROPERTIES
        and not _is_read(key, section)
        and not _listed(key, compat.REFUSED_KEYS)
        and not _listed(key, MEGATRON_REFUSED)
        and not _listed(key, compat.CONVERTED_KEYS)
        and not _listed(key, compat.RECIPE_ONLY_KEYS)
        and not _listed(key, INERT)
    ]
    assert not unaccounted, (
        "these keys are read nowhere in verl/ or recipe/ and are not refused, converted or inert "
        f"(make them take effect, or list them in verl/config/compat.py or inert.py): {unaccounted}"
    )


def test_keys_read_through_a_property_are_read_by_it_and_it_is_read():
    for key, (owner, prop) in READ_THROUGH_PROPERTIES.items():
        assert key.rsplit(".", 1)[-1] in inspect.getsource(getattr(owner, prop).fget), key
        assert any(prop in reads for reads, _ in _sources()), f"{prop} is read nowhere outside the schema"


def test_pending_calls_are_still_pending():
    for key, missing in PENDING_CALLS.items():
        section = dict(_leaves(PPOTrainerConfig))[key]
        assert not _is_read(key, section), f"{key} is read now: remove it from PENDING_CALLS ({missing})"


def test_the_lists_name_real_keys():
    leaves = [key for key, _ in _leaves(PPOTrainerConfig)]
    for key in [
        *INERT,
        *compat.REFUSED_KEYS,
        *MEGATRON_REFUSED,
        *compat.CONVERTED_KEYS,
        *compat.RECIPE_ONLY_KEYS,
        *PENDING_CALLS,
    ]:
        assert any(k == key or k.startswith(key + ".") for k in leaves), f"{key} is not a key of the schema"


# the name-based search finds a read of the same leaf name for another key in these files
NAME_CLASHES: dict[str, str] = {  # a listed key whose last name is read elsewhere for another key
    f"actor_rollout_ref.ref.{leaf}": "only the actor's is read (actor_rollout_ref.py): the reference computes no entropy"
    for leaf in (
        "entropy_from_logits_with_chunking",
        "entropy_from_logits_chunk_size",
        "entropy_checkpointing",
    )
}


def test_no_key_is_both_read_and_listed_inert():
    stale = [
        key
        for key, section in _leaves(PPOTrainerConfig)
        if _listed(key, ALWAYS_INERT_KEYS)
        and _is_read(key, section)
        and not key.startswith("reward")
        and key not in NAME_CLASHES
    ]
    assert not stale, f"listed as inert on every device but read somewhere: {stale}"


REFUSAL_EXAMPLES = {
    "reward_model.ulysses_sequence_parallel_size": "2",
    "reward_model.model.fsdp_config.ulysses_sequence_parallel_size": "2",
    "actor_rollout_ref.rollout.multi_turn.function_tool_path": "/tmp/tools.py",
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "2",
    "actor_rollout_ref.rollout.server.url": "http://127.0.0.1:8000",
    "reward_model.reward_loop_source": "importlib",
    "reward.reward_manager.source": "importlib",
    "trainer.default_hdfs_dir": "hdfs://x",
    "trainer.del_local_ckpt_after_load": "True",
}


def test_every_refused_key_has_an_example():
    assert set(REFUSAL_EXAMPLES) == set(compat.REFUSED_KEYS)


@pytest.mark.parametrize("key", sorted(REFUSAL_EXAMPLES))
def test_a_refused_value_fails_at_start_up_naming_the_key(key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config([f"{key}={REFUSAL_EXAMPLES[key]}"])
