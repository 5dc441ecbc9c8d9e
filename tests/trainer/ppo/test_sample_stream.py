"""Streaming generation (data.gen_batch_size below the batch): the units a step trains are the ones that
finish first, a replaced future is not taken twice, a step's units join into one batch, and the window
and the refusals follow from verl's keys."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future

import pytest
import torch

from verl.config.async_training import units_per_step
from verl.config.base import ConfigError
from verl.config.inert import inert_keys
from verl.config.ppo_trainer import load_config
from verl.experimental.fully_async_policy.fully_async_main import CONFIG_NAME
from verl.protocol import DataProto
from verl.trainer.ppo.generations import Finished, InFlight
from verl.trainer.ppo.sample_stream import SampleStream, join_units
from verl.workers.rollout.server_client import PendingBatch

STREAMING = ["actor_rollout_ref.rollout.mode=async", "data.gen_batch_size=1"]


def rows(values: list[int], metrics: dict[str, float] | None = None) -> DataProto:
    return DataProto.from_dict({"x": torch.tensor(values)}, meta_info={"metrics": metrics or {}})


def unit(index: int) -> InFlight:
    return InFlight(index, rows([index]), PendingBatch(Future()))


def test_a_step_takes_the_units_that_finish_first_in_the_order_they_finish():
    stream = SampleStream(units_per_step=2, window_units=4, total_units=4)
    in_flight = deque(unit(i) for i in (1, 2, 3, 4))
    futures = {generation.index: generation.future.future for generation in in_flight}
    for generation in in_flight:
        stream.watch(generation)
    for index in (3, 1):  # unit 3's responses come back first, then unit 1's
        futures[index].set_result(rows([index]))
    assert [stream.next_finished(in_flight).index for _ in range(2)] == [3, 1]
    assert [g.index for g in in_flight] == [2, 4]  # still in flight, in submission order


def test_a_unit_sent_again_is_taken_once_with_its_new_future():
    stream = SampleStream(units_per_step=1, window_units=2, total_units=2)
    first, other = unit(1), unit(2)
    in_flight = deque([first, other])
    stream.watch(first)
    stream.watch(other)
    old = first.future
    first.future = PendingBatch(Future())  # sent again (a rollout restart)
    stream.watch(first)
    old.future.set_result(rows([0]))  # the old request ends: not this unit's answer any more
    other.future.future.set_result(rows([2]))
    assert stream.next_finished(in_flight) is other
    threading.Timer(0.05, first.future.future.set_result, [rows([1])]).start()
    assert stream.next_finished(in_flight) is first
    assert not in_flight
    with pytest.raises(RuntimeError, match="none in flight"):
        stream.next_finished(in_flight)


def test_finished_units_kept_by_a_checkpoint_are_taken_at_once():
    stream = SampleStream(units_per_step=1, window_units=1, total_units=1)
    kept = InFlight(5, rows([5]), Finished(rows([50])))
    stream.watch(kept)
    assert stream.next_finished(deque([kept])) is kept


def test_a_steps_units_join_into_one_batch_with_averaged_metrics():
    taken = [
        (InFlight(7, rows([7, 7]), None, weight_version=2), rows([70, 71], {"a": 1.0, "b": 4.0})),
        (InFlight(3, rows([3, 3]), None, weight_version=1), rows([30, 31], {"a": 3.0})),
    ]
    joined = join_units(9, taken)
    assert joined.index == 9 and joined.parts == [7, 3] and joined.weight_version == 1
    assert joined.batch.batch["x"].tolist() == [7, 7, 3, 3]
    output = joined.future.get()
    assert output.batch["x"].tolist() == [70, 71, 30, 31]
    assert output.meta_info["metrics"] == {"a": 2.0, "b": 4.0}


def test_units_are_the_loaders_batches_cut_in_order_and_the_state_round_trips():
    stream = SampleStream(units_per_step=2, window_units=3, total_units=6)
    units = stream.units(iter([rows([1, 2, 3, 4]), rows([5, 6, 7, 8])]))
    assert next(units).batch["x"].tolist() == [1, 2]
    state = stream.state_dict()  # a checkpoint between two units of one batch
    resumed = SampleStream(units_per_step=2, window_units=3, total_units=6)
    resumed.load_state_dict(state)
    rest = resumed.units(iter([rows([5, 6, 7, 8])]))
    assert [next(rest).batch["x"].tolist() for _ in range(3)] == [[3, 4], [5, 6], [7, 8]]


def test_the_window_counts_units_and_bounds_the_run():
    stream = SampleStream(units_per_step=2, window_units=3, total_units=4)
    busy = deque([unit(1)])
    assert stream.may_submit(2, busy) and not stream.may_submit(3, busy)
    assert stream.may_submit(3, deque())  # nothing in flight: a recipe's extra draw goes on
    stream.submitted = 4
    assert not stream.may_submit(0, busy)


def test_verls_streaming_keys_give_the_units_and_window():
    config = load_config(
        [
            *STREAMING,
            "async_training.staleness_threshold=0.5",
            "async_training.trigger_parameter_sync_step=2",
        ],
        config_name=CONFIG_NAME,
    )
    assert units_per_step(config) == config.data.train_batch_size == 32
    assert config.async_training.window_units(32) == 96  # floor(1.5 x 2 x 32) prompts per sync
    assert config.async_training.window_units(1) == config.async_training.window_batches == 3


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["actor_rollout_ref.rollout.mode=async", "data.gen_batch_size=3"], "data.gen_batch_size"),
        (["data.gen_batch_size=1"], "actor_rollout_ref.rollout.mode"),
        (["actor_rollout_ref.rollout.mode=async", "data.gen_batch_size=0"], "data.gen_batch_size"),
    ],
    ids=["not-a-divisor", "batched-rollout", "zero"],
)
def test_a_bad_streaming_config_is_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides, config_name=CONFIG_NAME)


@pytest.mark.parametrize(
    "overrides",
    [
        ["data.gen_batch_size=1"],
        [
            "trainer.mode=async",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "data.gen_batch_size=64",
        ],
    ],
    ids=["sync-trainer", "above-the-batch"],
)
def test_a_gen_batch_size_that_streams_nothing_is_noted_as_inert(overrides):
    config = load_config(overrides)
    assert units_per_step(config) == 1
    assert "data.gen_batch_size" in inert_keys(config, "cpu", overrides)
