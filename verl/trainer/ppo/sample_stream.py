"""Sample-by-sample generation for the asynchronous trainer (verl's fully-async ``data.gen_batch_size=1``).

With ``data.gen_batch_size`` g below ``data.train_batch_size`` B, each step batch the data loader draws
is cut into ``u = B / g`` units, and each unit is one request (g prompts, ``rollout.n`` responses each)
to the rollout servers:

* units are submitted while the window allows: ``floor((1 + t) x k x u)`` since the last weight sync,
  counting those still unconsumed at it (``t`` = staleness_threshold or max_staleness, ``k`` =
  trigger_parameter_sync_step), which is the per-batch window of the other modes counted in units;
* a step trains the first ``u`` units to finish, in the order they finished, so a long response
  holds up only its own unit, which a later step trains (verl's rollouter feeding its queue);
* a unit that finishes more than ``max_staleness`` versions behind (one still running across two
  syncs) is generated again with the current weights instead of being trained or dropped
  (``async/regenerated_samples``; with ``drop_stale`` it is masked as in the other modes), so every
  prompt is trained once and within the bound.

What a seeded run trains depends on which responses finish first, so streamed steps are not
reproducible bit for bit (``gen_batch_size = train_batch_size`` is). A checkpoint keeps the units in
flight with their responses and the units drawn but not yet submitted: a resume trains every prompt
exactly once.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Iterator
from statistics import fmean

from verl.protocol import DataProto
from verl.trainer.ppo.generations import Finished, InFlight
from verl.utils.metric import reduce_metrics

POLL_S = 30.0  # how often a wait for the next finished unit checks that some unit is in flight


class SampleStream:
    def __init__(self, units_per_step: int, window_units: int, total_units: int) -> None:
        self.units_per_step = units_per_step
        self.window_units = window_units
        self.total_units = total_units  # the run's steps x units_per_step: none is submitted past it
        self.pending: deque[DataProto] = deque()  # drawn from the loader, not submitted yet
        self.submitted = 0  # units submitted in the run (the next one's number is this + 1)
        self.regenerated = 0  # prompts generated again because they finished too stale
        self._finished: queue.Queue[tuple[InFlight, object]] = queue.Queue()

    def units(self, batches: Iterator[DataProto]) -> Iterator[DataProto]:
        """The loader's step batches, ``units_per_step`` units each, in order."""
        while True:
            if not self.pending:
                self.pending.extend(next(batches).chunk(self.units_per_step))
            yield self.pending.popleft()

    def may_submit(self, window_submitted: int, in_flight: deque[InFlight]) -> bool:
        """Within the window and the run's length (or nothing in flight: a recipe drawing more per step)."""
        return (window_submitted < self.window_units or not in_flight) and (
            self.submitted < self.total_units or not in_flight
        )

    def watch(self, generation: InFlight) -> None:
        """Queue ``generation`` when its current future is done (with responses or an error)."""
        future = generation.future
        future.add_done_callback(lambda _: self._finished.put((generation, future)))

    def next_finished(self, in_flight: deque[InFlight]) -> InFlight:
        """The next unit of ``in_flight`` to finish, taken out of it. A future that was replaced (the unit
        was sent again after a rollout restart) or a unit no longer in flight is skipped."""
        while True:
            if not in_flight:
                raise RuntimeError("waiting for a finished generation with none in flight")
            try:
                generation, future = self._finished.get(timeout=POLL_S)
            except queue.Empty:
                continue
            at = next((i for i, g in enumerate(in_flight) if g is generation), None)
            if at is not None and generation.future is future:
                del in_flight[at]
                return generation

    def state_dict(self) -> dict:
        return {"pending": list(self.pending), "submitted": self.submitted, "regenerated": self.regenerated}

    def load_state_dict(self, state: dict) -> None:
        self.pending = deque(state["pending"])
        self.submitted, self.regenerated = state["submitted"], state["regenerated"]


def join_units(step: int, taken: list[tuple[InFlight, DataProto]]) -> InFlight:
    """A step's units as one generation: prompts and responses concatenated in the order the units were
    taken, the rollout's metrics averaged over the units that report them."""
    # a unit's metrics may hold one value per rank (a worker group's): one number each first
    reported = [reduce_metrics(output.meta_info.pop("metrics", {})) for _, output in taken]
    output = DataProto.concat([output for _, output in taken])
    keys = {key for metrics in reported for key in metrics}
    output.meta_info["metrics"] = {k: fmean(m[k] for m in reported if k in m) for k in keys}
    batch = DataProto.concat([generation.batch for generation, _ in taken])
    return InFlight(
        step,
        batch,
        Finished(output),
        weight_version=min(generation.weight_version for generation, _ in taken),
        parts=[generation.index for generation, _ in taken],
    )
