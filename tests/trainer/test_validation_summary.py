"""The before/after line printed at the end of ``fit()``."""

from __future__ import annotations

from verl.trainer.ppo.validation import Validator


def test_summary_reports_first_and_last_val_core_metrics():
    v = Validator(None, None, None, None, None, None)
    assert v.summary() == "no validation ran"
    v.history.append((0, {"val-core/arith/acc/mean@1": 0.315, "val-aux/arith/reward/mean@1": 0.3}))
    v.history.append((50, {"val-core/arith/acc/mean@1": 0.5}))
    v.history.append((150, {"val-core/arith/acc/mean@1": 0.935}))
    line = v.summary()
    assert "val-core/arith/acc/mean@1: 0.315 (step 0) -> 0.935 (step 150)" in line
    assert "val-aux" not in line


def _validated_steps(test_freq: int, total: int) -> list[int]:
    """The steps at which the trainer's loop validates (its own rule, on a validator that records)."""
    from types import SimpleNamespace

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    ran: list[int] = []
    trainer = SimpleNamespace(
        config=SimpleNamespace(trainer=SimpleNamespace(test_freq=test_freq)),
        total_training_steps=total,
        validator=SimpleNamespace(run=lambda step: ran.append(step) or {"val-core/x": 1.0}),
    )
    for step in range(1, total + 1):
        trainer.global_steps = step
        metrics = RayPPOTrainer._maybe_validate(trainer)
        assert ("timing_s/testing" in metrics) == (step in ran)
    return ran


def test_validation_follows_verls_test_freq_rule():
    # verl 0.9.1 validates when test_freq > 0, every test_freq steps and after the last one
    assert _validated_steps(3, 7) == [3, 6, 7]
    assert _validated_steps(7, 7) == [7]
    assert _validated_steps(-1, 7) == []
    assert _validated_steps(0, 7) == []
