"""Today's verl spellings load: each is converted onto the key read here (asserted), or refused in
one line naming the key, or listed as inert (see docs/verl_compat.md, "verl's newest spellings")."""

from __future__ import annotations

import re

import pytest

from verl.config.base import ConfigError
from verl.config.ppo_trainer import load_config

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
PACKED = "actor_rollout_ref.model.use_remove_padding=True"
TWO_RANKS = "trainer.n_gpus_per_node=2"


# ---------------------------------------------------------------- fsdp_config's Ulysses size
def test_the_actors_engine_spelling_of_ulysses_sets_the_actor_and_the_reference():
    config = load_config([PACKED, TWO_RANKS, f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size=2"])
    arr = config.actor_rollout_ref
    assert arr.actor.ulysses_sequence_parallel_size == arr.ref.ulysses_sequence_parallel_size == 2
    assert arr.ref.fsdp_config.ulysses_sequence_parallel_size == 2  # the engine spelling mirrors it


def test_the_critics_engine_spelling_of_ulysses_sets_the_critic():
    overrides = [
        "algorithm.adv_estimator=gae",
        "critic.model.use_remove_padding=True",
        TWO_RANKS,
        "critic.model.fsdp_config.ulysses_sequence_parallel_size=2",
    ]
    assert load_config(overrides).critic.ulysses_sequence_parallel_size == 2


def test_both_ulysses_spellings_with_different_sizes_are_an_error_naming_both():
    overrides = [
        PACKED,
        "trainer.n_gpus_per_node=4",
        f"{ACTOR}.ulysses_sequence_parallel_size=4",
        f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size=2",
    ]
    with pytest.raises(ConfigError) as error:
        load_config(overrides)
    message = str(error.value)
    assert message.startswith(f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size: expected the same value")
    assert f"{ACTOR}.ulysses_sequence_parallel_size=4" in message and "\n" not in message


def test_a_reference_size_apart_from_the_actors_is_still_refused():
    with pytest.raises(
        ConfigError, match=re.escape(f"{REF}.ulysses_sequence_parallel_size: expected the actor's")
    ):
        load_config([PACKED, TWO_RANKS, f"{REF}.fsdp_config.ulysses_sequence_parallel_size=2"])


def test_the_reward_models_ulysses_size_stays_refused():
    key = "reward_model.model.fsdp_config.ulysses_sequence_parallel_size"
    with pytest.raises(ConfigError, match=re.escape(key) + ".*no sequence parallelism"):
        load_config([f"{key}=2"])
