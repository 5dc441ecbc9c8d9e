"""The async trainer on a real local Ray: rollout pool (1 process) + trainer pool (1 process)."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from verl.builtin.assets import prepare_ppo_assets
from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.async_trainer import AsyncPPOTrainer, sample_staleness

RUN = [
    "trainer.n_gpus_per_node=1",
    "trainer.cpus_per_worker=1",
    "trainer.val_before_train=True",
    "trainer.test_freq=2",
    "trainer.logger=[file]",
    "trainer.project_name=async_test",
    "data.train_batch_size=8",
    "data.val_max_samples=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
    "actor_rollout_ref.actor.use_kl_loss=True",
]
# rollout/weight_sync_probe_gap: only the colocated weight sync is checked with a probe
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/", "async/", "rollout/weight_sync_probe_gap")


def stream(path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    out: dict[int, dict[str, float]] = {}
    for row in rows:
        out.setdefault(row.pop("step"), {}).update(
            {k: v for k, v in row.items() if not k.startswith(VOLATILE)}
        )
    return out


def test_sample_staleness_by_hand():
    versions = torch.tensor([[3, 3, 4, -1], [2, 2, 2, 2], [4, -1, -1, -1]])
    staleness, span = sample_staleness(versions, current_version=4)
    assert staleness.tolist() == [1, 2, 0] and span.tolist() == [1, 0, 0]


@pytest.mark.slow
def test_max_staleness_zero_equals_the_sync_trainer(ray_session, builtin_assets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = [*RUN, "trainer.total_training_steps=4"]
    for name, extra in {
        "sync": [],
        "async": ["trainer.mode=async", "async_training.max_staleness=0"],
    }.items():
        overrides = [*common, f"trainer.experiment_name={name}", *extra]
        run_ppo(load_config(overrides), overrides)
    sync = stream(tmp_path / "logs" / "async_test" / "sync" / "metrics.jsonl")
    async_ = stream(tmp_path / "logs" / "async_test" / "async" / "metrics.jsonl")
    assert sorted(sync) == sorted(async_) == [0, 1, 2, 3, 4]
    for step in sync:
        assert async_[step] == sync[step], f"step {step} differs"
    assert sync[4]["actor/pg_loss"] != 0  # a real update happened


@pytest.mark.parametrize("transport", ["object_store", "filesystem"])
def test_staleness_never_exceeds_the_bound(ray_session, builtin_assets, tmp_path, transport):
    bound, steps = 2, 4  # step 3's batch is the first the rollout can draw 2 versions ahead
    overrides = [
        *RUN,
        "trainer.logger=[console]",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.mode=async",
        f"async_training.max_staleness={bound}",
        f"async_training.weight_transport={transport}",
        f"async_training.weight_dir={tmp_path / 'weights'}",
    ]
    config = load_config(overrides)
    prepare_ppo_assets(config)
    trainer = AsyncPPOTrainer(config)
    try:
        trainer.init_workers()
        metrics = trainer.fit()
    finally:
        trainer.close()
    rows = 8 * 4
    assert len(trainer.staleness_seen) == steps * rows  # every consumed sample was checked
    assert max(trainer.staleness_seen) <= bound
    assert max(trainer.staleness_seen) >= 1  # the rollout really ran ahead of the trainer
    assert metrics["async/policy_version"] == steps - 1 and metrics["async/staleness_max"] <= bound
    if transport == "filesystem":  # only the newest published file is kept
        assert [p.name for p in (tmp_path / "weights").iterdir()] == [f"policy_v{steps}.safetensors"]


def test_weight_update_mid_generation_gives_per_token_versions(builtin_assets):
    """Another thread publishes new weights during the forward pass that yields token 9's
    logits: the update lands before token 9 is drawn, so the cache is rebuilt under the new
    weights, tokens 0-8 carry version 0 and tokens 9+ version 7."""
    from tests.workers.rollout.test_hf_rollout import make_rollout, prompt_batch

    rollout, tokenizer = make_rollout(builtin_assets, response_length=30, ignore_eos=True)
    new_weights = {k: v + 0.01 for k, v in rollout.module.state_dict().items()}
    calls = []

    def publish_during_forward(module, args):
        calls.append(1)
        if len(calls) == 10:  # forward 1 (prefill) gives token 0's logits, forward k token k-1's
            publisher = threading.Thread(target=rollout.update_weights, args=(new_weights.items(), 7))
            publisher.start()
            publisher.join()

    hook = rollout.module.register_forward_pre_hook(publish_during_forward)
    try:
        out = rollout.generate_sequences(prompt_batch(tokenizer, ["3+4=", "5+5="]))
    finally:
        hook.remove()
    for row in out.batch["response_versions"].tolist():
        assert row == [0] * 9 + [7] * 21
    assert out.batch["policy_version"].tolist() == [0, 0]
    assert rollout.version == 7
    for name, tensor in rollout.module.state_dict().items():  # swapped in whole
        assert torch.equal(tensor, new_weights[name]), name


# The asynchronous trainer learning the default task: test_fully_async.py (a sync every 2 updates,
# staleness_threshold 0.5), test_async_vllm.py (two vLLM replicas) and tests/recipe/test_dapo.py.


@pytest.mark.slow
def test_an_async_resume_continues_the_uninterrupted_run(ray_session, builtin_assets, tmp_path, monkeypatch):
    """A checkpoint at step 2 while step 3's batch is in flight (generated with version 1, whose
    weights the checkpoint does not hold): the checkpoint keeps that batch with its responses, so two
    resumes from it train steps 3-4 exactly as the uninterrupted run did (partial_rollout=False:
    every batch is generated with the version it was submitted at)."""
    monkeypatch.chdir(tmp_path)
    common = [
        *RUN,
        "trainer.total_training_steps=4",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.mode=async",
        "async_training.max_staleness=1",
        "async_training.partial_rollout=False",
    ]
    full = [*common, "trainer.experiment_name=full", "trainer.save_freq=2"]
    run_ppo(load_config(full), full)
    checkpoint = tmp_path / "checkpoints" / "async_test" / "full" / "global_step_2"
    assert checkpoint.is_dir()
    for name in ("resume_a", "resume_b"):
        resumed = [
            *common,
            f"trainer.experiment_name={name}",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={checkpoint}",
        ]
        run_ppo(load_config(resumed), resumed)
    logs = tmp_path / "logs" / "async_test"
    uninterrupted, a, b = (stream(logs / name / "metrics.jsonl") for name in ("full", "resume_a", "resume_b"))
    assert sorted(a) == sorted(b) == [3, 4]
    for step in (3, 4):
        assert a[step] == b[step] == uninterrupted[step], f"step {step}: a resume differs"
    assert a[3]["actor/pg_loss"] != 0
