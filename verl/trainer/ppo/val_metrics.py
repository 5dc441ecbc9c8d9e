"""Validation metrics over n sampled responses per prompt: mean@N, std@N, best@N, worst@N, maj@N.

:func:`process_validation_metrics` groups the per-response values (``reward``, ``acc``,
anything the scorer returns) by data source and prompt, computes the statistics per
prompt, then averages them over prompts. best/worst/maj@k use bootstrap resampling of k
responses out of the n, as in verl. :func:`flatten_validation_metrics` names them
``val-core/<data_source>/<var>/<metric>`` (the headline numbers) or ``val-aux/...``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["bootstrap_metric", "flatten_validation_metrics", "majority_value", "process_validation_metrics"]

N_BOOTSTRAP = 1000


def _subset_sizes(n: int) -> list[int]:
    """2, 4, 8, ... below n, then n itself (verl's schedule of k for best@k)."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return [*sizes, n]


def _bootstrap_indices(n: int, k: int, seed: int, n_bootstrap: int) -> np.ndarray:
    """[n_bootstrap, k] indices drawn with replacement.

    A fresh ``RandomState(seed)`` drawing all rows at once yields the same stream as verl's
    loop of ``np.random.seed(seed)`` + one ``np.random.choice`` per row, without touching
    numpy's global state.
    """
    return np.random.RandomState(seed).choice(n, size=(n_bootstrap, k), replace=True)


def bootstrap_metric(
    values: Sequence[float], k: int, seed: int = 42, n_bootstrap: int = N_BOOTSTRAP
) -> dict[str, tuple[float, float]]:
    """(mean, std) over bootstrap subsets of size ``k`` of the subset max (``best``) and min (``worst``)."""
    subsets = np.asarray(values, dtype=float)[_bootstrap_indices(len(values), k, seed, n_bootstrap)]
    best, worst = subsets.max(axis=1), subsets.min(axis=1)
    return {
        "best": (float(best.mean()), float(best.std())),
        "worst": (float(worst.mean()), float(worst.std())),
    }


def majority_value(values: Sequence[float], preds: Sequence[Any]) -> float:
    """The value of the first response whose prediction is the most common one.

    Ties go to the prediction seen first, as in verl's ``calc_maj_val``.
    """
    counts: dict[Any, int] = {}
    first_value: dict[Any, float] = {}
    for value, pred in zip(values, preds):
        counts[pred] = counts.get(pred, 0) + 1
        first_value.setdefault(pred, value)
    winner = max(counts, key=counts.__getitem__)  # max keeps the first of equal counts
    return float(first_value[winner])


def _majority_bootstrap(values: list, preds: list, k: int, seed: int) -> tuple[float, float]:
    indices = _bootstrap_indices(len(values), k, seed, N_BOOTSTRAP)
    votes = [majority_value([values[i] for i in row], [preds[i] for i in row]) for row in indices]
    return float(np.mean(votes)), float(np.std(votes))


def _prompt_metrics(values: list, preds: list | None, seed: int) -> dict[str, float]:
    """Statistics of the n responses to one prompt for one variable."""
    n = len(values)
    metrics = {f"mean@{n}": float(np.mean(values))}
    if n == 1:
        return metrics
    metrics[f"std@{n}"] = float(np.std(values))
    for k in _subset_sizes(n):
        stats = bootstrap_metric(values, k, seed=seed)
        metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"] = stats["best"]
        metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"] = stats["worst"]
        if preds is not None:
            metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"] = _majority_bootstrap(values, preds, k, seed)
    return metrics


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[Any],
    infos_dict: Mapping[str, Sequence[Any]],
    seed: int = 42,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {var: {metric: value}}}``, each metric averaged over prompts.

    ``sample_uids[i]`` groups the responses of one prompt; ``infos_dict[var][i]`` is the value
    of ``var`` for response ``i`` (string-valued variables are skipped; a ``pred`` variable
    enables maj@k). Per prompt with n responses: ``mean@n``, ``std@n`` (population std), and
    for k in 2, 4, ..., n: ``best@k/mean|std``, ``worst@k/mean|std``, ``maj@k/mean|std``.
    """
    for var, values in infos_dict.items():
        if len(values) != len(data_sources):
            raise ValueError(f"infos_dict[{var!r}] has {len(values)} values for {len(data_sources)} samples")
    groups: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids, strict=True)):
        groups[source][uid].append(i)
    return {source: _average_over_prompts(uid2rows, infos_dict, seed) for source, uid2rows in groups.items()}


def _average_over_prompts(
    uid2rows: Mapping[Any, list[int]], infos_dict: Mapping[str, Sequence[Any]], seed: int
) -> dict[str, dict[str, float]]:
    """Per-prompt metrics of one data source, averaged over its prompts."""
    preds_all = infos_dict.get("pred")
    per_var: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rows in uid2rows.values():
        preds = [preds_all[i] for i in rows] if preds_all is not None else None
        for var, values in infos_dict.items():
            picked = [values[i] for i in rows]
            if isinstance(picked[0], str):
                continue
            for name, value in _prompt_metrics(picked, preds, seed).items():
                per_var[var][name].append(value)
    return {
        var: {name: float(np.mean(vals)) for name, vals in metrics.items()}
        for var, metrics in per_var.items()
    }


def flatten_validation_metrics(
    data_src2var2metric2val: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[str, float]:
    """Flat names for the logger, as in verl.

    The core variable is ``acc`` when the scorer reports it, else ``reward``. Its ``mean@``,
    ``maj@`` and ``best@`` metrics at the largest n go to ``val-core/<source>/<var>/<metric>``;
    everything else to ``val-aux/...``.
    """
    flat: dict[str, float] = {}
    for source, var2metrics in data_src2var2metric2val.items():
        core_var = "acc" if "acc" in var2metrics else "reward"
        for var, metrics in var2metrics.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metrics)
            for name, value in metrics.items():
                is_core = (
                    var == core_var
                    and name.startswith(("mean", "maj", "best"))
                    and name.split("/")[0].endswith(f"@{n_max}")
                )
                flat[f"{'val-core' if is_core else 'val-aux'}/{source}/{var}/{name}"] = value
    return flat
