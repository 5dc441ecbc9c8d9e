"""The step progress bar: shown with ETA and key metrics on a terminal, silent otherwise."""

from __future__ import annotations

import io

from verl.utils.progress import StepProgress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


STEP = {"critic/score/mean": 0.5, "response_length/mean": 12.0, "timing_s/step": 1.25, "other/x": 3.0}


def test_bar_on_a_terminal_shows_eta_and_key_metrics():
    out = FakeTerminal()
    with StepProgress(total_steps=4, stream=out) as bar:
        assert bar.enabled
        bar.update(STEP)
    text = out.getvalue()
    assert "1/4" in text and "ETA" in text
    assert "score=0.5" in text and "resp_len=12" in text and "step_s=1.25" in text
    assert "other" not in text


def test_silent_when_not_a_terminal():
    out = io.StringIO()
    with StepProgress(total_steps=4, stream=out) as bar:
        assert not bar.enabled
        bar.update(STEP)
    assert out.getvalue() == ""


def test_resumed_run_starts_at_the_initial_step():
    out = FakeTerminal()
    with StepProgress(total_steps=10, initial_step=5, stream=out) as bar:
        bar.update(STEP)
    assert "6/10" in out.getvalue()


def test_last_validation_score_stays_on_show():
    bar = StepProgress(total_steps=3, enabled=False)
    assert "val" not in bar.postfix(STEP)
    assert bar.postfix({**STEP, "val-core/arith/acc/mean@1": 0.25})["val"] == "0.25"
    assert bar.postfix(STEP)["val"] == "0.25"  # a step without validation
    bar.close()
