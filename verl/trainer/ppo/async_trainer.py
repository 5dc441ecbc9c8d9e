"""Asynchronous off-policy PPO/GRPO: the rollout generates ahead on its own pool while the actor trains.

``trainer.mode=async``. Same phases as :class:`RayPPOTrainer` (it is one), two differences:

* generation for step ``s`` is submitted as soon as policy version ``s-1-max_staleness`` is
  published, so up to ``max_staleness`` batches are generated while the actor trains;
* after each actor update the new weights are published (Ray object store, or safetensors
  files) and staged in the rollout, which swaps them in between two decoding steps: a
  response that spans an update carries per-token versions (``response_versions``).

One step, for step ``s`` (the trainer holds policy version ``v = s - 1``)::

    submit   generations for steps up to s + max_staleness      (rollout pool, non-blocking)
    gen      wait for step s's responses; check staleness v - min(token versions) <= bound
    reward, old_log_prob (proximal), ref, values, adv, update    (trainer pool, as in sync)
    update_weights  publish v + 1 -> rollout                     (atomic swap between decode steps)

With ``async_training.partial_rollout=False`` a batch is instead generated entirely with the
version published when it was submitted (newer versions wait, kept by version in the rollout),
so a seeded run gives the same samples however the threads are scheduled.

The loss is the decoupled PPO objective: the PPO ratio is taken against the proximal
log-probs the trainer recomputes (``old_log_probs``), and each token is weighted by the
truncated importance weight ``min(pi_prox / pi_behav, actor.tis_imp_ratio_cap)`` with the
behaviour log-probs from the rollout (``rollout_log_probs``). With ``max_staleness=0`` the
run is numerically the synchronous one.

verl's one-step-off and fully-async entry points are this trainer under presets: the rule above is
one case of a submission window (``async_training.window_batches`` generations per weight sync,
counting those unconsumed at it), and with ``trigger_parameter_sync_step`` k the weights are
published every k updates (:mod:`verl.config.fully_async`). The driver owns the policy version; a
checkpoint keeps it and the generations in flight with their responses, so a resume trains exactly
what the uninterrupted run would have. A rollout process that dies is replaced (the pool restarts
with the current weights and its generations are submitted again), up to
``async_training.rollout_max_restarts`` times.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterator
from functools import cached_property

from verl.config.async_training import units_per_step
from verl.config.ppo_trainer import PPOTrainerConfig
from verl.protocol import DataProto
from verl.single_controller import WorkerDiedError
from verl.trainer.ppo import builders
from verl.trainer.ppo.generations import Draw, Finished, InFlight, check_staleness, sample_staleness
from verl.trainer.ppo.partial_rollout import continuation_prompts, prefix_prompts, stitch
from verl.trainer.ppo.prompts import attach_responses, pop_prompts, repeat_prompts
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, timed
from verl.trainer.ppo.recipe_surface import RolloutWeights
from verl.trainer.ppo.sample_stream import SampleStream, join_units
from verl.trainer.ppo.teachers import Teachers
from verl.trainer.ppo.validation import Validator
from verl.utils.model import eos_token_ids
from verl.workers.rollout.server_client import RolloutServerError
from verl.workers.weight_transport import transport_of

logger = logging.getLogger(__name__)


class AsyncPPOTrainer(RayPPOTrainer):
    def __init__(self, config: PPOTrainerConfig) -> None:
        super().__init__(config)
        self.async_cfg = config.async_training
        if self.async_cfg.weight_dir is not None:  # workers get absolute paths, as for checkpoints
            self.async_cfg.weight_dir = os.path.abspath(os.path.expanduser(self.async_cfg.weight_dir))
        self.policy_version = 0
        self.staleness_seen: list[int] = []  # every consumed sample, in order
        self.version_spans_seen: list[int] = []  # newest - oldest token version of each, in order
        self.consumed_generations: list[int] = []  # the index of every consumed generation, in order
        self._in_flight: deque[InFlight] = deque()  # submitted, not yet consumed
        self._window_submitted = 0  # generations submitted since the last sync, or unconsumed at it
        self.rollout_restarts = 0  # rollout pools replaced after a process died (rollout_max_restarts)
        self._updates_since_sync = 0  # actor updates since the last publish (trigger_parameter_sync_step)
        self.samples_submitted = 0  # rows sent for generation (a continuation is not a new one)
        # one exact version per generation call: the batch's (partial_rollout=False), or its prefix's and
        # its continuation's (partial_rollout_interrupt_at)
        self.pinned = (
            not self.async_cfg.partial_rollout or self.async_cfg.partial_rollout_interrupt_at is not None
        )
        cfg = self.async_cfg  # verl's compute_prox_log_prob: the actor keeps the weights of each sync
        self.keeps_proximal = cfg.use_rollout_log_probs and cfg.compute_prox_log_prob
        units = units_per_step(config)  # > 1: streaming, data.gen_batch_size prompts per request
        self.stream = None
        if units > 1:
            self.stream = SampleStream(units, cfg.window_units(units), self.total_training_steps * units)

    def init_workers(self) -> None:
        self.wgs, self.pools = builders.build_async_worker_groups(self.config, self.device)
        self.actor_rollout_wg = self.wgs["actor"]  # the sync phases train on this group
        self.rollout_wg = self.wgs["rollout"]
        self.critic_wg = self.wgs.get("critic")
        self.ref_policy_wg = self.actor_rollout_wg if self.use_reference_policy else None
        self.rm_wg = self.wgs.get("reward_model")
        self.teachers = Teachers.from_worker_groups(self.wgs, self.config.distillation.teacher_key)
        self.use_reward_model_scores()
        self.world_size = self.actor_rollout_wg.world_size
        self.rollout_client = builders.build_rollout_client(self.config, self.rollout_wg, self.tokenizer)
        self.async_rollout_manager = self.rollout_client
        self.checkpoint_manager = RolloutWeights(self)
        self.validator = Validator(
            self.config, self.tokenizer, self.rollout_client, self.val_reward_fn, self.tracker, self.data.val
        )

    # ------------------------------------------------------------------ producer
    def _batches(self) -> Iterator[InFlight]:
        """Generations in the order they were submitted; each draw first submits more while the
        window allows (``async_training.window_batches`` since the last weight sync, counting those
        unconsumed at it: ``max_staleness + 1`` per step for trainer.mode=async, verl's
        ``(1 + staleness_threshold) x trigger_parameter_sync_step`` for its fully-async keys).
        Generation ``g`` is seeded by ``g``; with one draw per step (the core loop) ``g`` is the step
        it trains, none is submitted past the last step, and a sample is at most ``max_staleness``
        versions old when trained. A recipe that draws more per step (``next_draw``) takes the next
        ones, which are fresher, and more are submitted as needed. With streaming (``data.gen_batch_size``
        below the batch) the units to finish first make the draw instead (:meth:`_streamed`)."""
        prompts = self._prompt_batches()
        if self.stream is not None:
            return self._streamed(self.stream.units(prompts))
        return self._in_order(prompts)

    def _in_order(self, prompts: Iterator[DataProto]) -> Iterator[InFlight]:
        in_flight = self._in_flight  # after a resume, the generations the checkpoint kept come first
        submitted = self.global_steps - 1 + len(in_flight)  # fit() has already counted the step about to run
        while True:
            while (self._window_submitted < self.async_cfg.window_batches or not in_flight) and (
                submitted < self.total_training_steps or not in_flight
            ):
                submitted += 1
                self._window_submitted += 1
                in_flight.append(self._submit_generation(submitted, next(prompts)))
            yield in_flight.popleft()

    def _streamed(self, units: Iterator[DataProto]) -> Iterator[InFlight]:
        """Streaming (:mod:`~verl.trainer.ppo.sample_stream`): each draw joins the next
        ``units_per_step`` units to finish."""
        for generation in self._in_flight:  # kept by a checkpoint with their responses
            self.stream.watch(generation)
        while True:
            taken: list[tuple[InFlight, DataProto]] = []
            while len(taken) < self.stream.units_per_step:
                generation = self._next_unit(units)
                output = self._responses(generation)
                if not self._regenerate_if_stale(generation, output):
                    taken.append((generation, output))
            yield join_units(self.global_steps, taken)

    def _next_unit(self, units: Iterator[DataProto]) -> InFlight:
        """Submit units while the window allows, then wait for the first one in flight to finish."""
        stream, in_flight = self.stream, self._in_flight
        while stream.may_submit(self._window_submitted, in_flight):
            stream.submitted += 1
            self._window_submitted += 1
            in_flight.append(self._submit_generation(stream.submitted, next(units)))
            stream.watch(in_flight[-1])
        return stream.next_finished(in_flight)

    def _regenerate_if_stale(self, generation: InFlight, output: DataProto) -> bool:
        """A streamed unit that finished beyond max_staleness (it ran across more syncs than the bound
        allows) is sent again with the current weights; with drop_stale it is masked at the step instead."""
        staleness, _ = sample_staleness(output.batch["response_versions"], self.policy_version)
        if self.async_cfg.drop_stale or int(staleness.max()) <= self.async_cfg.max_staleness:
            return False
        self._resubmit(generation)
        self._in_flight.append(generation)
        self.stream.watch(generation)
        self.stream.regenerated += len(generation.prompts)
        return True

    def _resubmit(self, generation: InFlight) -> None:
        """Send a generation's prompts again (same seeds), with the version published now."""
        generation.weight_version = self.policy_version
        if "weight_version" in generation.prompts.meta_info:
            generation.prompts.meta_info["weight_version"] = self.policy_version
        generation.future = self.rollout_client.generate_sequences(generation.prompts, blocking=False)

    def next_draw(self, draw: int) -> InFlight:
        """A step's further draw is the next generation in flight (seeded by its own index)."""
        return next(self.batches)

    def _submit_generation(self, index: int, batch: DataProto) -> InFlight:
        batch = repeat_prompts(batch, str(index), self.config.actor_rollout_ref.rollout.n)
        prompts = pop_prompts(batch, self.config.actor_rollout_ref.rollout.uses_agent_loop)
        prompts.meta_info.update(global_steps=index, do_sample=True, sampling_seed=index)
        if self.pinned:  # generated with this version, whatever the timing
            prompts.meta_info["weight_version"] = self.policy_version
        interrupted = self._trained_after_next_sync(index)
        if interrupted:
            prefix_prompts(prompts, self.async_cfg.partial_rollout_interrupt_at)
        self.samples_submitted += len(prompts)
        future = self.rollout_client.generate_sequences(prompts, blocking=False)
        return InFlight(index, batch, future, self.policy_version, prompts, interrupted)

    def _trained_after_next_sync(self, index: int) -> bool:
        """With ``partial_rollout_interrupt_at``: whether generation ``index`` trains (at step ``index``)
        after the next weight sync, which comes after step ``global_steps + k - 1 - updates since the
        last sync``. A guess that is wrong (a recipe drawing more per step) only means no switch."""
        if self.async_cfg.partial_rollout_interrupt_at is None:
            return False
        k = self.async_cfg.trigger_parameter_sync_step
        return index > self.global_steps + k - 1 - self._updates_since_sync

    def _continue(self, generation: InFlight) -> None:
        """Send the rest of an interrupted generation, with the version published now."""
        prefix = self._wait(generation)
        rollout = self.config.actor_rollout_ref.rollout
        generation.prompts = continuation_prompts(
            generation.prompts, prefix, rollout.response_length, self.policy_version
        )
        generation.prefix, generation.interrupted = prefix, False
        generation.weight_version = self.policy_version
        generation.future = self.rollout_client.generate_sequences(generation.prompts, blocking=False)

    def _responses(self, pending: InFlight) -> DataProto:
        """The generation's responses, a prefix joined to its continuation (one wanted before the sync it
        was interrupted for is continued with the current version)."""
        if pending.interrupted:
            self._continue(pending)
        output = self._wait(pending)
        if pending.prefix is None:
            return output
        return stitch(pending.prefix, output, self._eos_token_ids)

    @cached_property
    def _eos_token_ids(self) -> list[int]:
        """The ids that end a response, as the rollout has them ([-1]: none, with rollout.ignore_eos)."""
        if self.config.actor_rollout_ref.rollout.ignore_eos:
            return [-1]
        return eos_token_ids(self.tokenizer, self.config.actor_rollout_ref.model.path)

    def _wait(self, pending: InFlight) -> DataProto:
        """What the generation's future holds; a rollout process that died on the way is replaced first
        (in server mode its requests fail first: the pool is then asked whether a process died)."""
        try:
            return pending.future.get()
        except (WorkerDiedError, RolloutServerError) as error:
            died = error if isinstance(error, WorkerDiedError) else self._rollout_death()
            if died is None:  # the server failed the request, its process lives: the error is the request's
                raise
            self._restart_rollout(died, pending)
            return pending.future.get()

    def _rollout_death(self) -> WorkerDiedError | None:
        """The error of a call to the rollout pool if one of its processes is dead, else None."""
        try:
            self.rollout_wg.get_version()
        except WorkerDiedError as error:
            return error
        return None

    def _restart_rollout(self, error: WorkerDiedError, pending: InFlight | None = None) -> None:
        """Replace the rollout pool's processes, load the current weights, and submit every generation
        they held again (same prompts and seeds; pinned to the current version), up to
        ``async_training.rollout_max_restarts`` times; the trainer's state is untouched."""
        limit = self.async_cfg.rollout_max_restarts
        if self.rollout_restarts >= limit:
            error.add_note(
                f"(the rollout pool was restarted {limit} times: async_training.rollout_max_restarts)"
            )
            raise error
        self.rollout_restarts += 1
        again = [
            g for g in [pending, *self._in_flight] if g is not None and not isinstance(g.future, Finished)
        ]
        logger.warning(
            "step %d: a rollout process died (%s); restarting the rollout pool (%d of %d) and resubmitting "
            "%d generations",
            self.global_steps,
            error,
            self.rollout_restarts,
            limit,
            len(again),
        )
        self.rollout_client.close()
        self.rollout_wg = builders.restart_rollout_group(self.config, self.wgs, self.pools)
        self.rollout_client = builders.build_rollout_client(self.config, self.rollout_wg, self.tokenizer)
        self.validator.rollout_client = self.rollout_client
        for generation in again:  # older versions died with the old processes
            generation.weight_version = self.policy_version
        self._publish_weights()
        for generation in again:
            self._resubmit(generation)
            if self.stream is not None:
                self.stream.watch(generation)

    # ------------------------------------------------------------------ phases
    def rollout_phase(self, draw: Draw, metrics: dict[str, float], timing: dict[str, float]) -> DataProto:
        """As in sync (responses, reward), then check how stale the samples are."""
        batch = super().rollout_phase(draw, metrics, timing)
        metrics.update(self._check_staleness(batch))
        return batch

    def _generated(self, draw: Draw, metrics: dict[str, float], timing: dict[str, float]) -> DataProto:
        """Wait for the generation's responses (``timing_s/gen`` is the time the trainer waited)."""
        assert isinstance(draw, InFlight), "the asynchronous trainer's draws are its generations in flight"
        with timed("gen", timing):
            output = self._responses(draw)
        batch = draw.batch
        metrics.update(attach_responses(batch, output))
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        self.consumed_generations.extend(draw.parts or [draw.index])
        if self.stream is not None:
            metrics["async/regenerated_samples"] = float(self.stream.regenerated)
        return batch

    def _check_staleness(self, batch: DataProto) -> dict[str, float]:
        cfg = self.async_cfg
        where = f"step {self.global_steps}"
        staleness, span, metrics = check_staleness(
            batch, self.policy_version, cfg.max_staleness, cfg.drop_stale, where
        )
        self.staleness_seen.extend(staleness.tolist())
        self.version_spans_seen.extend(span.tolist())
        metrics["async/rollout_restarts"] = float(self.rollout_restarts)
        return metrics

    def sync_weights(self) -> dict[str, float]:
        """After every ``trigger_parameter_sync_step``-th actor update: publish the next version to the
        rollout pool, and open a new submission window (the generations still unconsumed count in it)."""
        self._updates_since_sync += 1
        if self._updates_since_sync < self.async_cfg.trigger_parameter_sync_step:
            return {}
        self._updates_since_sync = 0
        self.policy_version += 1
        megabytes = self._publish_weights()
        self._keep_proximal_weights()
        self._window_submitted = len(self._in_flight)
        for generation in self._in_flight:  # interrupted for this sync: the rest with the new version
            if generation.interrupted:
                self._continue(generation)
        return {"rollout/weight_sync_mb": megabytes}

    def _keep_proximal_weights(self) -> None:
        """verl's compute_prox_log_prob: the actor keeps the weights just published, the proximal policy of
        the window's later updates (not needed with one update per sync)."""
        if self.keeps_proximal and self.async_cfg.trigger_parameter_sync_step > 1:
            self.actor_rollout_wg.keep_proximal_weights()

    def _compute_old_log_prob(self, batch: DataProto) -> tuple[DataProto, float]:
        """``old_log_probs`` under the current weights, or with verl's compute_prox_log_prob under the
        weights of the last sync (the ones the rollout runs) after the window's first update."""
        batch.meta_info["proximal_weights"] = self.keeps_proximal and self._updates_since_sync > 0
        try:
            return super()._compute_old_log_prob(batch)
        finally:
            batch.meta_info.pop("proximal_weights")

    def _publish_weights(self) -> float:
        """Actor -> rollout, as one versioned unit (staged whole, swapped between decode steps) by
        ``async_training.weight_transport``; returns its size in MB."""
        cfg = self.async_cfg
        # a rollout restarted mid-window gets the window's version, kept by the actor with compute_prox_log_prob
        # (else the current weights, one or more local updates past it, under the version's number)
        proximal = (
            self.keeps_proximal and cfg.trigger_parameter_sync_step > 1 and self._updates_since_sync > 0
        )
        parcel = self.actor_rollout_wg.publish_weights(
            self.policy_version, cfg.weight_transport, cfg.weight_dir, proximal
        )[0]
        keep_from = None  # partial rollout: swapped in at once, mid-batch
        if self.pinned and self.config.actor_rollout_ref.rollout.mode == "async":
            # a server takes a version as it comes: the batches in flight finish with theirs first (verl's
            # one-step-off in server mode: the sync waits for the batch in flight)
            self._finish_in_flight(older_than=self.policy_version)
        elif self.pinned:  # kept until the batches submitted with older versions have run
            keep_from = min([b.weight_version for b in self._in_flight] + [self.policy_version])
        try:
            self.rollout_wg.receive_weights(parcel, keep_from)
        except WorkerDiedError as error:  # the restarted pool is sent these weights anew
            transport_of(parcel).discard(parcel)
            self._restart_rollout(error)
            return parcel.megabytes
        transport_of(parcel).discard(parcel)  # every rollout rank holds it now
        return parcel.megabytes

    # ------------------------------------------------------------------ checkpoints
    def _driver_state(self) -> dict:
        """As in sync, plus the generations in flight, waited for and kept with their responses (and
        the submission window): a resume trains on exactly the samples the uninterrupted run trains
        on, though the weights that generated them are not in the checkpoint. The data position is
        the one after their prompts."""
        state = super()._driver_state()
        self._finish_in_flight()
        state["in_flight"] = list(self._in_flight)
        state["window_submitted"] = self._window_submitted
        if self.stream is not None:
            state["stream"] = self.stream.state_dict()
        return state

    def _finish_in_flight(self, older_than: int | None = None) -> None:
        """Wait for the generations in flight (those submitted with a version below ``older_than``) and
        keep their responses with them."""
        for generation in self._in_flight:
            if isinstance(generation.future, Finished):
                continue
            if older_than is not None and generation.weight_version >= older_than:
                continue
            generation.future = Finished(self._responses(generation))
            generation.prefix = None  # joined in the output kept
            if self.stream is not None:  # the future it was watched by is replaced
                self.stream.watch(generation)

    def _restore_driver_state(self, state: dict) -> None:
        self._in_flight = deque(state.get("in_flight", []))
        self._window_submitted = state.get("window_submitted", len(self._in_flight))
        if self.stream is not None:
            self.stream.load_state_dict(state["stream"])

    def _load_checkpoint(self) -> bool:
        resumed = super()._load_checkpoint()  # restores policy_version (saved at a sync: save_freq % k == 0)
        self._publish_weights()  # the rollout starts from the actor's (possibly restored) weights
        self._keep_proximal_weights()
        return resumed
