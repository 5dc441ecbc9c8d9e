"""``prime``: the reward manager of PRIME (Cui et al. 2025, "Process Reinforcement through Implicit
Rewards", arXiv:2502.01456), whose verifiers (code execution, math checking) can hang.

As verl's: every response is scored in parallel processes (up to 64) with a per-call timeout of
300 s; a call that times out or raises scores 0; a scorer may return a number or a tuple / list
whose first item is the score; the scores are also written to ``data.batch["acc"]``. Here the
processes are the scoring pool's (:mod:`verl.workers.reward_manager.pool`): a hung call is killed
and its process replaced, instead of the whole pool being torn down after each batch.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from verl.protocol import DataProto
from verl.workers.reward_manager.base import ScoredBatch
from verl.workers.reward_manager.naive import NaiveRewardManager
from verl.workers.reward_manager.pool import ScoreOutcome
from verl.workers.reward_manager.registry import register

__all__ = ["PrimeRewardManager"]

PRIME_TIMEOUT_S = 300.0
PRIME_MAX_WORKERS = 64


@register("prime")
class PrimeRewardManager(NaiveRewardManager):
    """Naive scoring in a pool of ``num_workers`` processes (default: one per CPU, at most 64), each
    call limited to ``timeout_s`` (default 300 s)."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Any = None,
        reward_fn_key: str = "data_source",
        num_workers: int | None = None,
        timeout_s: float = PRIME_TIMEOUT_S,
    ) -> None:
        if num_workers is None:
            num_workers = min(PRIME_MAX_WORKERS, os.cpu_count() or 1)
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, num_workers, timeout_s)

    def score_responses(self, data: DataProto, responses: list[str]) -> list[ScoreOutcome]:
        return [_first_item(outcome) for outcome in super().score_responses(data, responses)]

    def verify(self, data: DataProto) -> list[float]:
        """Score every response (0 for a failed call), store the scores as ``data.batch["acc"]``."""
        responses, _ = self.decode_responses(data)
        scores = ScoredBatch(self.score_responses(data, responses)).scores
        _store_acc(data, scores)
        return scores

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        result = super().__call__(data, return_dict=True)
        scores = result["reward_extra_info"].get("score")
        if scores is not None:  # None: the reward came from a reward model (rm_scores)
            _store_acc(data, scores)
        return result if return_dict else result["reward_tensor"]


def _first_item(outcome: ScoreOutcome) -> ScoreOutcome:
    """A PRIME verifier may return ``(score, details...)``: keep the score."""
    if outcome.status == "ok" and isinstance(outcome.value, (tuple, list)) and outcome.value:
        return ScoreOutcome("ok", outcome.value[0])
    return outcome


def _store_acc(data: DataProto, scores: list[float]) -> None:
    device = data.batch["responses"].device
    data.batch["acc"] = torch.tensor(scores, dtype=torch.float32, device=device)
