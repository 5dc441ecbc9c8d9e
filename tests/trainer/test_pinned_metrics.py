"""A seeded 2-step run of the embedded default logs the recorded metric stream: any change to the
numbers (an estimator, a loss, sampling, the data order, the weight sync) shows up here, on purpose
or not. After an intended change, record again and say why in the commit::

    VERL_RECORD_PINNED=1 python -m pytest tests/trainer/test_pinned_metrics.py

Only numbers that depend on the computation are pinned (no timings, throughput or memory). They
are compared with a relative tolerance of 1e-4: float rounding differs between CPUs (with and
without fused multiply-add), but a real change moves these metrics by far more.
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
            if not math.isclose(row[k], want[k], rel_tol=RTOL, abs_tol=ATOL)
        ]
    assert not changed, "the metric stream changed:\n" + "\n".join(changed)
