"""Resume with the Megatron engine (tensor parallel 2 on 2 ranks, megatron's distributed optimizer):
a run of 4 steps saves at step 2; a second run resumes from that checkpoint, and its steps 3 and 4
(losses, gradient norms, rewards, validation) equal the first run's bit for bit.

Both runs are trainings in the test process (their workers import the test-only megatron-core CPU
shim as a model plugin: tests/megatron/worker_plugin.py). That a run SIGKILLed at any step, or while saving, resumes to the
uninterrupted stream is the trainer's business, not the engine's: tests/trainer/test_resume.py kills
real ``main_ppo`` processes for it."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")

from tests.megatron.worker_plugin import OVERRIDES as SHIM
from tests.trainer.fit import fit_trainer
from tests.trainer.test_resume import RUN, metric_stream
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo import checkpoint as ckpt

pytestmark = pytest.mark.slow

STEPS = 4  # saved at 2 and 4 (trainer.save_freq=2 in test_resume.RUN)
MEGATRON = [
    *RUN,
    *SHIM,
    f"trainer.total_training_steps={STEPS}",  # later than RUN's: these win
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
]


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_megatron_run_resumed_from_a_checkpoint_continues_the_uninterrupted_stream(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    monkeypatch.chdir(first)
    fit_trainer(load_config(MEGATRON))
    saved = first / "checkpoints" / "resume" / "run"
    assert ckpt.read_pointer(str(saved)) == STEPS
    assert sorted(p.name for p in (saved / "global_step_2" / "actor").glob("megatron_rank_*.pt")) == [
        "megatron_rank_0.pt",
        "megatron_rank_1.pt",
    ]

    monkeypatch.chdir(second)
    resume = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={saved / 'global_step_2'}"]
    fit_trainer(load_config([*MEGATRON, *resume]))

    expected, resumed = metric_stream(first), metric_stream(second)
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
        assert all(key in expected[step] for step in range(1, STEPS + 1)), (key, sorted(expected[1]))
    assert sorted(resumed) == [3, 4], sorted(resumed)
    for step in resumed:
        assert resumed[step] == expected[step], f"step {step} differs"
