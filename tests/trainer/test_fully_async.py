"""``python -m verl.experimental.fully_async_policy.fully_async_main``: verl's fully-async keys on the
asynchronous trainer. The preset and the conversions (batch from require_batches, run length from
total_rollout_steps, validation per sync), the errors naming the key, the submission window, verl's
own DAPO line on two CPU processes with real vLLM servers, and a run with staleness_threshold=0.5 and
a sync every 2 updates that learns the default task, never trains a sample beyond the bound, switches
versions inside responses and trains every generation once and in order; a rollout process killed
mid-run is replaced and no generation is lost or trained twice; streamed prompt by prompt
(data.gen_batch_size=1 on servers), a killed server and a crash with resume lose no prompt."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.trainer import verl_lines
from tests.trainer.fit import fit_trainer
from tests.trainer.test_learning import ACC, MIN_GAIN
from tests.trainer.test_vllm_learning import needs_vllm
from tests.trainer.verl_lines import swapped
from verl.builtin.assets import prepare_ppo_assets
from verl.config.base import ConfigError
from verl.config.inert import inert_keys
from verl.config.ppo_trainer import load_config
from verl.experimental.fully_async_policy.fully_async_main import CONFIG_NAME, ENTRY, check_fully_async
from verl.single_controller.ray.resource_pool import ResourcePoolError
from verl.trainer.ppo.async_trainer import AsyncPPOTrainer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests/trainer/config/verl_scripts/fully_async/dapo_7b_math_fsdp2_4_4.sh"
ASYNC = ["trainer.mode=async", "actor_rollout_ref.rollout.calculate_log_probs=True"]
SMALL_WINDOWS = [  # a sync every 2 updates, samples at most one version old; one trainer process
    "trainer.n_gpus_per_node=1",
    "trainer.logger=[console]",
    "async_training.staleness_threshold=0.5",
    "async_training.trigger_parameter_sync_step=2",
]


def test_the_preset_is_the_async_trainer_with_verls_defaults():
    config = load_config([], config_name=CONFIG_NAME)
    cfg = config.async_training
    assert config.trainer.mode == "async" and not config.actor_rollout_ref.hybrid_engine
    assert (cfg.staleness_threshold, cfg.trigger_parameter_sync_step, cfg.require_batches) == (0.1, 4, 1)
    assert cfg.partial_rollout and config.algorithm.rollout_correction.bypass_mode
    assert cfg.max_staleness == 1  # ceil(0.1): a consumed sample may be one version old
    assert cfg.window_batches == 4  # floor(1.1 x 4) batches per sync window
    megatron = load_config([], config_name="fully_async_ppo_megatron_trainer")
    assert megatron.actor_rollout_ref.actor.strategy == "megatron" and megatron.trainer.mode == "async"


def test_verls_sizes_become_the_trainers():
    config = load_config(
        [
            "async_training.require_batches=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "rollout.total_rollout_steps=330",
            "rollout.test_freq=3",
            "async_training.trigger_parameter_sync_step=2",
            "async_training.staleness_threshold=0.5",
        ],
        config_name=CONFIG_NAME,
    )
    assert config.data.train_batch_size == 32  # 2 mini-batches of 16 prompts per update
    assert config.trainer.total_training_steps == 10  # 330 prompts // 32
    assert config.trainer.test_freq == 6  # every 3 syncs of 2 updates
    assert (config.async_training.max_staleness, config.async_training.window_batches) == (1, 3)


def test_a_zero_threshold_is_the_on_policy_pipeline_of_max_staleness_zero():
    """staleness_threshold=0 with a sync per update is the window of max_staleness=0, whose run equals
    the synchronous trainer's (test_async.py::test_max_staleness_zero_equals_the_sync_trainer)."""
    fully = load_config([*ASYNC, "async_training.staleness_threshold=0"]).async_training
    plain = load_config([*ASYNC, "async_training.max_staleness=0"]).async_training
    assert (
        (fully.max_staleness, fully.window_batches) == (plain.max_staleness, plain.window_batches) == (0, 1)
    )


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["async_training.staleness_threshold=-0.5"], "async_training.staleness_threshold"),
        (
            ["async_training.staleness_threshold=0.5", "async_training.max_staleness=3"],
            "async_training.max_staleness",
        ),
        (
            ["async_training.use_dynamic_resource_scheduling=True"],
            "async_training.use_dynamic_resource_scheduling",
        ),
        (["async_training.trigger_parameter_sync_step=4", "trainer.save_freq=6"], "trainer.save_freq"),
        (["rollout.total_rollout_steps=31"], "rollout.total_rollout_steps"),
        (["async_training.staleness_threshold=null", "async_training.require_batches=2"], "require_batches"),
        (["trainer.mode=sync", "async_training.staleness_threshold=null"], "trigger_parameter_sync_step"),
    ],
    ids=[
        "negative",
        "two-spellings",
        "dynamic",
        "save-off-sync",
        "fewer-than-a-step",
        "no-threshold",
        "sync",
    ],
)
def test_a_bad_fully_async_config_is_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides, config_name=CONFIG_NAME)


def test_verls_scheduling_knobs_are_noted_as_inert():
    given = ["async_training.concurrent_samples_per_replica=8", "async_training.use_trainer_do_validate=True"]
    noted = inert_keys(load_config(given, config_name=CONFIG_NAME), "cpu", given)
    assert set(noted) >= {
        "async_training.concurrent_samples_per_replica",
        "async_training.use_trainer_do_validate",
    }


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_fully_async_run_learns_within_the_bound_and_trains_each_generation_once():
    steps = 32
    overrides = [
        *SMALL_WINDOWS,
        f"trainer.total_training_steps={steps}",
        "rollout.test_freq=4",  # every 4 syncs = 8 steps
        "async_training.partial_rollout=True",
        # a batch trained after the next sync switches to its version at response token 2 (of 4)
        "async_training.partial_rollout_interrupt_at=2",
    ]
    config = load_config(overrides, config_name=CONFIG_NAME)
    prepare_ppo_assets(config)
    trainer = fit_trainer(config, AsyncPPOTrainer)
    rows = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    assert trainer.consumed_generations == list(range(1, steps + 1))  # each once, in order: none lost
    assert trainer.samples_submitted == len(trainer.staleness_seen) == steps * rows  # samples in == out
    assert max(trainer.staleness_seen) <= 1  # ceil(0.5) versions, on every consumed sample
    # every other batch spans a sync: its responses longer than 2 tokens carry two versions
    spanning = sum(span > 0 for span in trainer.version_spans_seen)
    assert rows <= spanning <= steps // 2 * rows, spanning
    assert trainer.policy_version == steps // 2
    history = [(step, metrics[ACC]) for step, metrics in trainer.validator.history]
    print(f"fully async run: {history}")
    first, best = history[0][1], max(acc for step, acc in history if step >= steps // 2)
    assert best >= first + MIN_GAIN, history


class KillsTheRollout(AsyncPPOTrainer):
    """SIGKILLs the rollout process once, right after step ``kill_after`` (generations are in flight);
    records, after a window's first update, how far the trainer's old log-probs are from the rollout's
    on the tokens generated with the window's weights."""

    kill_after = 2

    def _old_log_prob_phase(self, batch, metrics):
        super()._old_log_prob_phase(batch, metrics)
        if self._updates_since_sync:
            b = batch.batch
            own = b["response_mask"].bool() & (b["response_versions"] == self.policy_version)
            gap = (b["old_log_probs"] - b["rollout_log_probs"]).abs()[own]
            worst = float(gap.max()) if gap.numel() else 0.0
            self.proximal_gaps = [*getattr(self, "proximal_gaps", []), (int(own.sum()), worst)]

    def train_step(self, batch):
        metrics = super().train_step(batch)
        if self.global_steps == self.kill_after:
            self.killed_pid = self.rollout_wg.pids[0]
            os.kill(self.killed_pid, signal.SIGKILL)
        return metrics


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_killed_rollout_process_is_replaced_and_no_generation_is_lost():
    """Also verl's compute_prox_log_prob: after a window's first update the trainer's old log-probs are
    those of the weights of the last sync, which the rollout scored its tokens with (the current
    weights, one update later, were 5 nats away on some token when measured)."""
    steps = 6
    overrides = [
        *SMALL_WINDOWS,
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "async_training.compute_prox_log_prob=True",
    ]
    config = load_config(overrides, config_name=CONFIG_NAME)
    assert not config.algorithm.rollout_correction.bypass_mode  # the trainer computes old_log_probs
    prepare_ppo_assets(config)
    trainer = fit_trainer(config, KillsTheRollout)
    assert len(trainer.proximal_gaps) == steps // 2 and trainer.proximal_gaps[0][0] > 0, trainer.proximal_gaps
    assert max(gap for _, gap in trainer.proximal_gaps) < 1e-4, trainer.proximal_gaps
    assert trainer.rollout_restarts == 1
    assert trainer.rollout_wg.pids[0] != trainer.killed_pid  # a new process generates
    assert trainer.consumed_generations == list(range(1, steps + 1))  # each trained once, in order
    assert trainer.policy_version == steps // 2


class KillsTheServerThenCrashes(AsyncPPOTrainer):
    """SIGKILLs the rollout server's process after step 2 (before the units of the next window are sent to
    it), then fails at the start of step ``crash_at``, past the checkpoint at ``crash_at - 2`` (the step
    between is lost, as in a crash)."""

    crash_at = 4
    last: AsyncPPOTrainer | None = None

    def train_step(self, batch):
        KillsTheServerThenCrashes.last = self
        if self.global_steps == self.crash_at:
            raise RuntimeError("crash")
        metrics = super().train_step(batch)
        if self.global_steps == 2:
            self.killed_pid = self.rollout_wg.pids[0]
            os.kill(self.killed_pid, signal.SIGKILL)
        return metrics


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_streamed_run_survives_a_killed_server_and_a_crash_and_trains_every_prompt_once(
    tmp_path, monkeypatch
):
    """verl's sample-by-sample streaming (data.gen_batch_size=1 on rollout servers): each step trains the
    16 one-prompt units that finished first. The server's process SIGKILLed after step 2 is replaced when
    the requests of the next window fail (the units sent again); a crash after the step-2 checkpoint and a resume from it: each of the run's
    64 prompts is trained exactly once, none more than one version old."""
    monkeypatch.chdir(tmp_path)
    steps = 4
    overrides = [
        *SMALL_WINDOWS,
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",  # 16 prompts per step
        "actor_rollout_ref.rollout.mode=async",
        "data.gen_batch_size=1",
    ]
    config = load_config(overrides, config_name=CONFIG_NAME)
    prepare_ppo_assets(config)
    with pytest.raises(RuntimeError, match="crash"):
        fit_trainer(config, KillsTheServerThenCrashes)
    crashed = KillsTheServerThenCrashes.last
    assert crashed.rollout_restarts == 1 and crashed.rollout_wg.pids[0] != crashed.killed_pid
    units = config.data.train_batch_size  # one prompt each
    resumed = fit_trainer(load_config(overrides, config_name=CONFIG_NAME), AsyncPPOTrainer)
    n = config.actor_rollout_ref.rollout.n
    before = crashed.consumed_generations[: 2 * units]  # steps 1-2, in the checkpoint
    assert sorted(before + resumed.consumed_generations) == list(range(1, steps * units + 1))
    assert resumed.global_steps == steps and resumed.stream.submitted == steps * units
    stale = crashed.staleness_seen[: 2 * units * n] + resumed.staleness_seen
    assert max(stale) <= 1 and len(stale) == steps * units * n


# After the runs on the hf rollout: a run with an engine leaves no worker process for the next one
# (tests/trainer/test_algorithms_e2e.py), but starts in the two that these left.
@needs_vllm
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_verls_fully_async_dapo_line_trains_two_steps_on_cpu(builtin_assets, tmp_path, monkeypatch):
    from verl.trainer.main_ppo import run_ppo

    monkeypatch.chdir(tmp_path)
    data = str(Path(builtin_assets["train"]).parent)
    lines = "\n".join(verl_lines.script_args(SCRIPT, ENTRY))
    overrides = [
        *swapped(lines, builtin_assets["model"], data),
        "trainer.n_gpus_per_node=1",  # a trainer process and a rollout process on two cores
        "rollout.n_gpus_per_node=1",
        "rollout.total_rollout_steps=32",  # two updates of require_batches (4) x ppo_mini_batch_size (4)
        "trainer.logger=[file]",
    ]
    config = load_config(overrides, config_name=CONFIG_NAME)
    check_fully_async(config)
    assert (
        config.actor_rollout_ref.rollout.name == "vllm" and config.actor_rollout_ref.rollout.mode == "async"
    )
    assert (config.data.train_batch_size, config.trainer.total_training_steps) == (16, 2)
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 2
    assert metrics["async/staleness_max"] == 0  # no sync yet: both batches on version 0
    assert "async/regenerated_samples" in metrics  # the line's data.gen_batch_size=1 streams
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert metrics[key] == metrics[key], key  # finite


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_rollout_pool_the_cluster_cannot_hold_is_refused_naming_its_key():
    config = load_config(["trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=4"], config_name=CONFIG_NAME)
    trainer = AsyncPPOTrainer(config)
    try:
        with pytest.raises(ResourcePoolError, match=r"'rollout_pool' needs 4 CPUs.*rollout\.n_gpus_per_node"):
            trainer.init_workers()
    finally:
        trainer.close()
