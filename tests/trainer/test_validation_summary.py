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
