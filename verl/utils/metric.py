"""Reducing metric lists to numbers (verl's ``verl.utils.metric``).

A worker group's ranks each report their metrics; ``DataProto.concat`` gathers them into one list
per key (and a worker may report a list per key itself, one entry per micro-batch). The driver then
reduces each list to one number: the maximum for a key naming ``max``, the minimum for ``min``, the
mean otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["reduce_metrics"]


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Replace each value of ``metrics`` (a number or a list of numbers) by its max, min or mean, by
    the key's name, in place; returns ``metrics``. A plain number stays as it is."""
    for key, values in metrics.items():
        if "max" in key:
            metrics[key] = np.max(values)
        elif "min" in key:
            metrics[key] = np.min(values)
        else:
            metrics[key] = np.mean(values)
    return metrics
