"""A seeded 2-step run of the embedded default logs the recorded metric stream: any change to the
numbers (an estimator, a loss, sampling, the data order, the weight sync) shows up here, on purpose
or not. After an intended change, record again and say why in the commit::

    VERL_RECORD_PINNED=1 python -m pytest tests/trainer/test_pinned_metrics.py

Only numbers that depend on the computation are pinned (no timings, throughput or memory). Float
rounding differs between CPUs (vector width, BLAS code paths), so the tolerances follow what that can
move: everything computed from the initial weights (validation at step 0, the rollout, rewards,
advantages and losses of step 1) within a relative 1e-4; gradient norms, sums over every parameter's
gradient, within 1e-3; and step 2, whose samples come from the updated weights, within 2% or 0.01
(measured: the step-1 gradient norm of the recording machine and of an AMD EPYC differ by 1.3e-4
relative, which flips one of step 2's 256 sampled answers, moving its mean score by 0.004). A real
change (an estimator, a loss, the data order, sampling) moves step 1 by far more; a weight sync that
goes wrong shows in ``rollout/weight_sync_probe_gap``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.trainer.fit import fit_trainer
from verl.config.ppo_trainer import load_config

RECORD = Path(__file__).parent / "pinned" / "grpo_2_steps.json"
UNPINNED = ("timing_s/", "timing_per_token_ms/", "perf/", "throughput", "actor/lr_", "memory")
RTOL, ATOL = 1e-4, 1e-6
GRAD_RTOL = 1e-3
AFTER_UPDATE_RTOL, AFTER_UPDATE_ATOL = 2e-2, 1e-2


def tolerance(row: dict, key: str) -> tuple[float, float]:
    if row.get("step", 0) >= 2:
        return AFTER_UPDATE_RTOL, AFTER_UPDATE_ATOL
    if key.endswith("grad_norm"):
        return GRAD_RTOL, ATOL
    return RTOL, ATOL


def pinned(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not any(u in k for u in UNPINNED)}


@pytest.mark.usefixtures("ray_session", "builtin_assets")
@pytest.mark.parametrize("skip_old_log_prob", [True, False])
def test_a_seeded_run_logs_the_recorded_metrics(tmp_path, monkeypatch, skip_old_log_prob):
    """Both ways of getting old_log_probs on this on-policy run (the update's own forward, and the
    separate pass verl runs) log the same numbers."""
    config = load_config(
        [
            f"trainer.skip_on_policy_old_log_prob={skip_old_log_prob}",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.save_freq=-1",
            "data.val_max_samples=64",
            "trainer.logger=[file]",
            "trainer.project_name=pinned",
            "trainer.experiment_name=run",
        ]
    )
    monkeypatch.chdir(tmp_path)  # logs/ (the file logger) goes here
    fit_trainer(config)
    lines = (tmp_path / "logs/pinned/run/metrics.jsonl").read_text().splitlines()
    stream = [pinned(json.loads(line)) for line in lines]
    if os.environ.get("VERL_RECORD_PINNED") == "1" and skip_old_log_prob:
        RECORD.write_text(json.dumps(stream, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(RECORD.read_text())
    assert len(stream) == len(recorded), "a different number of logged rows"
    changed = []
    for i, (row, want) in enumerate(zip(stream, recorded)):
        assert set(row) == set(want), f"row {i}: metrics {sorted(set(row) ^ set(want))} appeared or vanished"
        changed += [
            f"row {i} {k}: recorded {want[k]!r}, now {row[k]!r}"
            for k in want
            if not math.isclose(row[k], want[k], rel_tol=tolerance(want, k)[0], abs_tol=tolerance(want, k)[1])
        ]
    assert not changed, "the metric stream changed:\n" + "\n".join(changed)
