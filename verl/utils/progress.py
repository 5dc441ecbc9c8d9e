"""A progress bar over training steps, with ETA and a few key metrics.

Shown only when the output stream is a terminal: under a job scheduler or with output
redirected to a file it stays silent, so logs hold only the logger lines.

    with StepProgress(total_steps=100, initial_step=global_step) as bar:
        for ...:
            bar.update(metrics)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["KEY_METRICS", "StepProgress"]

# metric name -> short label shown after the bar (the first val-core metric is added too)
KEY_METRICS: dict[str, str] = {
    "critic/score/mean": "score",
    "response_length/mean": "resp_len",
    "actor/entropy": "entropy",
    "timing_s/step": "step_s",
    "train/loss": "loss",  # SFT
    "val/loss": "val_loss",  # SFT
}
_BAR_FORMAT = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed} elapsed, ETA {remaining}]{postfix}"
)


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _short(value: Any) -> str:
    value = float(value)
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"


class StepProgress:
    """tqdm bar over ``total_steps`` steps that shows :data:`KEY_METRICS` after each update.

    ``enabled=None`` (the default) turns the bar on only when ``stream`` (stdout by default)
    is a TTY. ``initial_step`` lets a resumed run start the bar where it left off.
    """

    def __init__(
        self,
        total_steps: int,
        initial_step: int = 0,
        enabled: bool | None = None,
        stream: TextIO | None = None,
        desc: str = "Training",
    ):
        stream = stream if stream is not None else sys.stdout
        self.enabled = _is_tty(stream) if enabled is None else enabled
        self._bar = tqdm(
            total=total_steps,
            initial=initial_step,
            desc=desc,
            unit="step",
            file=stream,
            disable=not self.enabled,
            dynamic_ncols=True,
            bar_format=_BAR_FORMAT,
        )
        self._val_metric: str | None = None
        self._last_val: str | None = None

    def postfix(self, metrics: Mapping[str, Any]) -> dict[str, str]:
        """The short labels and values shown after the bar for these metrics."""
        shown = {label: _short(metrics[name]) for name, label in KEY_METRICS.items() if name in metrics}
        if self._val_metric is None:
            self._val_metric = next((name for name in metrics if name.startswith("val-core/")), None)
        if self._val_metric is not None and self._val_metric in metrics:
            self._last_val = _short(metrics[self._val_metric])
        if self._last_val is not None:
            shown["val"] = self._last_val  # validation runs every few steps; keep the last value on show
        return shown

    def update(self, metrics: Mapping[str, Any] | None = None, steps: int = 1) -> None:
        """Advance by ``steps`` and show the key metrics of ``metrics``."""
        if metrics:
            self._bar.set_postfix(self.postfix(metrics), refresh=False)
        self._bar.update(steps)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
