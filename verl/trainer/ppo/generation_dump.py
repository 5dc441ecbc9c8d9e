"""``trainer.rollout_data_dir`` / ``trainer.validation_data_dir``: generations as JSON lines.

As verl does, each call writes ``<dir>/<step>.jsonl``, one line per response::

    {"input": prompt text, "output": response text, "gts": ground truth, "score": total reward,
     "step": N, ...per-response values the scorer returned (acc, ...)}
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["dump_rollouts", "write_generations"]

_SCALARS = (str, int, float, bool, type(None), np.generic)


def write_generations(
    folder: str,
    step: int,
    inputs: Sequence[str],
    outputs: Sequence[str],
    scores: Sequence[float],
    gts: Sequence[Any] | None = None,
    extra: dict[str, Sequence[Any]] | None = None,
) -> str:
    """Write ``<folder>/<step>.jsonl`` (replacing a file from an earlier attempt at this step);
    ``extra`` columns of the right length are added to every line. Returns the file's path."""
    n = len(inputs)
    columns: dict[str, Sequence[Any]] = {
        "input": inputs,
        "output": outputs,
        "gts": gts if gts is not None else [None] * n,
        "score": scores,
        "step": [step] * n,
    }
    for key, values in (extra or {}).items():
        if key not in columns and len(values) == n:
            columns[key] = values
    folder = os.path.expanduser(folder)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{step}.jsonl")
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({k: _plain(v[i]) for k, v in columns.items()}, ensure_ascii=False) + "\n")
    logger.info("wrote %d generations to %s", n, path)
    return path


def dump_rollouts(batch: DataProto, tokenizer: Any, folder: str | None, step: int) -> str | None:
    """A scored training batch to ``<folder>/<step>.jsonl`` (``trainer.rollout_data_dir``; None:
    nothing). Every non-tensor column of plain values (data_source, uid, acc, ...) is added."""
    if not folder:
        return None
    lengths = batch.batch["response_mask"].sum(-1).tolist()
    responses = batch.batch["responses"]
    outputs = [
        tokenizer.decode(responses[i, : int(n)], skip_special_tokens=True) for i, n in enumerate(lengths)
    ]
    inputs = tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
    scores = batch.batch["token_level_scores"].sum(-1).tolist()
    extra = {
        key: column.tolist()
        for key, column in batch.non_tensor_batch.items()
        if all(isinstance(v, _SCALARS) for v in column)
    }
    return write_generations(folder, step, inputs, outputs, scores, ground_truths(batch), extra)


def ground_truths(batch: DataProto) -> list[Any]:
    """``reward_model["ground_truth"]`` of each row (None where a row has none)."""
    column = batch.non_tensor_batch.get("reward_model")
    if column is None:
        return [None] * len(batch)
    return [r.get("ground_truth") if isinstance(r, dict) else None for r in column]


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (*_SCALARS, list, dict)):
        return value
    return str(value)
