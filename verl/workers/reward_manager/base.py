"""What every reward manager shares: decode responses, score them in the pool, place the scores.

Call convention (verl's): ``manager(data, return_dict=False)``. ``data`` carries ``prompts``
[B, P], ``responses`` [B, R], ``attention_mask`` [B, P+R] and the non-tensor columns
``data_source`` (or whatever ``data.reward_fn_key`` names), ``reward_model`` (with
``ground_truth``) and ``extra_info``. Each response is decoded from its valid tokens only
(special tokens skipped) and scored; the score goes on the response's LAST valid token of a
[B, R] float tensor, zeros elsewhere. With ``return_dict=True`` the result is::

    {"reward_tensor": [B, R] tensor,
     "reward_extra_info": {"score": [...], "acc": [...], <keys a scorer returned in a dict>: [...]},
     "reward_metrics": {"reward/errors": n, "reward/timeouts": n}}

``acc`` is the scorer's own ``acc`` when it returns a dict that has one, else its score (for
the built-in 0/1 scorers the two coincide). A call that raised, timed out, or returned
something that is not a number or a dict with a numeric ``"score"`` scores 0.0 and is counted.
If ``data.batch`` has ``rm_scores`` (a reward-model worker ran), they are the reward, as in verl,
unless a custom function is configured (``custom_reward_function.path``): then that function is
called as usual with the row's model score added to its ``extra_info`` as ``rm_score``, and
returns the reward (e.g. the model score plus a rule bonus). After a multi-turn rollout, its
``tool_rewards`` and ``turn_scores`` columns are in each call's ``extra_info`` too. With a
generative reward model (``judge_addresses``), every call also gets ``reward_router_address``: the
base URL of a judge server (OpenAI-compatible ``/v1/chat/completions``), spread over the servers
row by row.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.reward_score import UnknownDataSourceError, default_compute_score, is_known_data_source
from verl.utils.reward_score.scorer_process import ScorerSpec
from verl.workers.reward_manager.abstract import AbstractRewardManager
from verl.workers.reward_manager.pool import ScoreOutcome, ScoringPool, check_picklable

MULTI_TURN_RESULTS = ("tool_rewards", "turn_scores")
"""Per-row lists a multi-turn rollout reports (tool rewards, an interaction's turn scores); the scorer
finds them in its ``extra_info``, as verl's reward loop passes them."""

__all__ = ["RewardManager", "ScoredBatch"]

logger = logging.getLogger(__name__)


class ScoredBatch:
    """Per-row scores, extra info columns and failure counts gathered from scorer outcomes."""

    def __init__(self, outcomes: list[ScoreOutcome]) -> None:
        self.scores: list[float] = []
        self.extra: dict[str, list[Any]] = {}
        self.errors = self.timeouts = 0
        self.first_problem: str | None = None
        for outcome in outcomes:
            self._add(outcome)

    def _add(self, outcome: ScoreOutcome) -> None:
        score, fields, problem = _read_outcome(outcome)
        if outcome.status == "timeout":
            self.timeouts += 1
        elif problem is not None:
            self.errors += 1
        self.first_problem = self.first_problem or problem
        self.scores.append(0.0 if score is None else score)
        for column in self.extra.values():
            column.append(None)
        for key, value in fields.items():
            # A key first seen on this row gets None for the rows before it.
            self.extra.setdefault(key, [None] * len(self.scores))[-1] = value

    def extra_info(self) -> dict[str, list[Any]]:
        """``score`` and ``acc`` for every row, then the scorers' own keys (None where absent)."""
        acc = self.extra.get("acc") or [None] * len(self.scores)
        out = {"score": list(self.scores), "acc": [_acc(a, s) for a, s in zip(acc, self.scores)]}
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


def _acc(reported: Any, score: float) -> float:
    try:
        return score if reported is None else float(reported)
    except (TypeError, ValueError):
        return score


def _read_outcome(outcome: ScoreOutcome) -> tuple[float | None, dict[str, Any], str | None]:
    """``(score, extra fields, problem)``: score None and a problem when the call failed or
    returned something that is not a finite number (or a dict with one under ``"score"``)."""
    if outcome.status != "ok":
        return None, {}, f"{outcome.status}: {outcome.message}"
    value = outcome.value
    fields: dict[str, Any] = {}
    if isinstance(value, Mapping):
        fields = {k: v for k, v in value.items() if k != "score"}
        value = value.get("score")
    try:
        # bools, numpy and 0-d torch scalars all convert; strings are never scores
        score = None if isinstance(value, (str, bytes)) else float(value)
    except (TypeError, ValueError):
        score = None
    if score is None or not math.isfinite(score):
        return (
            None,
            {},
            f"the scorer returned {outcome.value!r:.200}; expected a finite number or a dict with 'score'",
        )
    return score, fields, None


class RewardManager(AbstractRewardManager):
    """Base class: subclasses say how calls are made (:meth:`score_responses`) and may reshape
    rewards (:meth:`shape_rewards`).

    ``compute_score`` is a plain function (verl's), a :class:`ScorerSpec`, or None for the built-in
    scorers. With ``num_workers > 0`` calls run in that many scorer processes, each call under
    ``timeout_s``; a function is sent to them by reference, so it must be importable (module level):
    a lambda or closure is refused at construction with the fix (``num_workers=0`` runs it in this
    process, without the timeout)."""

    default_kind = "default"
    """ScorerSpec kind used when no compute_score is given."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int = 0,
        compute_score: Callable[..., Any] | ScorerSpec | None = None,
        reward_fn_key: str = "data_source",
        num_workers: int = 0,
        timeout_s: float = 10.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.reward_fn_key = reward_fn_key
        if compute_score is None or (
            compute_score is default_compute_score and self.default_kind == "default"
        ):
            compute_score = ScorerSpec(kind=self.default_kind)
        elif not isinstance(compute_score, ScorerSpec):
            compute_score = ScorerSpec(kind="callable", fn=compute_score)
        self.spec = compute_score
        self.num_workers, self.timeout_s = num_workers, timeout_s
        if num_workers > 0:
            check_picklable(compute_score)  # fail now, not at the first scoring call
        self._pool: ScoringPool | None = None
        self.judge_addresses: list[str] = []
        """Base URLs of a generative reward model's servers (``reward_model.rollout.name``); each
        scorer call gets one as ``reward_router_address``, row by row in turn."""

    @property
    def pool(self) -> ScoringPool:
        """The scoring pool, started on first use (so building a manager starts no process)."""
        if self._pool is None:
            self._pool = ScoringPool(self.spec, num_workers=self.num_workers, timeout_s=self.timeout_s)
        return self._pool

    def __getstate__(self) -> dict[str, Any]:
        # Processes and pipes cannot be pickled; a copy sent elsewhere (e.g. to a Ray task)
        # starts its own pool on first use.
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

    # ------------------------------------------------------------------ the call
    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        if "rm_scores" in data.batch.keys() and self.spec.kind in ("default", "default_batch"):
            reward = data.batch["rm_scores"]
            metrics = {"reward/errors": 0, "reward/timeouts": 0}
            return (
                {"reward_tensor": reward, "reward_extra_info": {}, "reward_metrics": metrics}
                if return_dict
                else reward
            )
        responses, lengths = self.decode_responses(data)
        scored = ScoredBatch(self.score_responses(data, responses))
        rewards = torch.tensor(scored.scores, dtype=torch.float32)
        extra = scored.extra_info()
        rewards = self.shape_rewards(rewards, lengths, extra)
        reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        rows = torch.arange(len(data))
        # An empty response has no valid token; its reward goes to position 0, which the
        # response mask zeroes out anyway.
        reward_tensor[rows, (lengths - 1).clamp(min=0)] = rewards
        self.print_examples(data, responses, scored.scores)
        if scored.first_problem is not None:
            # One line per batch, not per row: a broken scorer would otherwise flood the log.
            logger.warning(
                "reward: %d errors and %d timeouts in %d scorer calls (scored 0); first: %s",
                scored.errors,
                scored.timeouts,
                len(responses),
                scored.first_problem,
            )
        if not return_dict:
            return reward_tensor
        metrics = {"reward/errors": scored.errors, "reward/timeouts": scored.timeouts}
        return {"reward_tensor": reward_tensor, "reward_extra_info": extra, "reward_metrics": metrics}

    def decode_responses(self, data: DataProto) -> tuple[list[str], torch.Tensor]:
        """Decoded responses (valid tokens only, special tokens skipped) and their valid lengths."""
        prompt_len = data.batch["prompts"].shape[-1]
        lengths = data.batch["attention_mask"][:, prompt_len:].sum(dim=-1).long()
        ids = data.batch["responses"]
        token_lists = [ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]
        return self.tokenizer.batch_decode(token_lists, skip_special_tokens=True), lengths

    def score_calls(self, data: DataProto, responses: list[str]) -> list[dict[str, Any]]:
        """Keyword arguments of one per-row scorer call for each response (verl's names)."""
        sources = data.non_tensor_batch[self.reward_fn_key]
        reward_models = data.non_tensor_batch["reward_model"]
        extras = data.non_tensor_batch.get("extra_info")
        calls = [
            {
                "data_source": sources[i],
                "solution_str": responses[i],
                "ground_truth": _ground_truth(reward_models[i]),
                "extra_info": extras[i] if extras is not None else None,
            }
            for i in range(len(responses))
        ]
        for key in MULTI_TURN_RESULTS:
            column = data.non_tensor_batch.get(key)
            for call, value in zip(calls, column if column is not None else []):
                call["extra_info"] = {**(call["extra_info"] or {}), key: list(value)}
        if "rm_scores" in data.batch.keys():
            for call, score in zip(calls, data.batch["rm_scores"].sum(-1).tolist()):
                call["extra_info"] = {**(call["extra_info"] or {}), "rm_score": score}
        for i, call in enumerate(calls):
            if self.judge_addresses:
                call["reward_router_address"] = self.judge_addresses[i % len(self.judge_addresses)]
        return calls

    # ------------------------------------------------------------------ hooks
    def score_responses(self, data: DataProto, responses: list[str]) -> list[ScoreOutcome]:
        """One outcome per response; subclasses decide how calls are grouped."""
        raise NotImplementedError

    def shape_rewards(
        self, rewards: torch.Tensor, lengths: torch.Tensor, extra: dict[str, list[Any]]
    ) -> torch.Tensor:
        """Adjust per-row rewards after scoring (identity here; DAPO adds a length penalty)."""
        return rewards

    # ------------------------------------------------------------------ helpers
    def check_data_sources(self, locations: Mapping[str, str]) -> None:
        """Raise before training if a data source has no scorer. ``locations`` maps each source to
        where it first appears (e.g. ``"train.parquet, row 0"``). Custom scorers accept anything."""
        if self.spec.kind not in ("default", "default_batch"):
            return
        for source, location in locations.items():
            if not is_known_data_source(source):
                raise UnknownDataSourceError(
                    f"{location}, column {self.reward_fn_key!r}: no built-in scorer for data_source {source!r}; "
                    "set custom_reward_function.path/name to score it with your own function"
                )

    def print_examples(self, data: DataProto, responses: list[str], scores: list[float]) -> None:
        """Print the first ``num_examine`` responses of each data source (a quick sanity check)."""
        if self.num_examine <= 0:
            return
        printed: dict[str, int] = defaultdict(int)
        sources = data.non_tensor_batch[self.reward_fn_key]
        for i, source in enumerate(sources):
            if printed[source] >= self.num_examine:
                continue
            printed[source] += 1
            prompt_len = data.batch["prompts"].shape[-1]
            prompt_ids = data.batch["prompts"][i][data.batch["attention_mask"][i, :prompt_len].bool()]
            print("[prompt]", self.tokenizer.decode(prompt_ids.tolist(), skip_special_tokens=True))
            print("[response]", responses[i])
            print("[ground_truth]", _ground_truth(data.non_tensor_batch["reward_model"][i]))
            print("[score]", scores[i])

    def close(self) -> None:
        """Stop the scorer processes (a later call starts a new pool)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _ground_truth(reward_model: Any) -> Any:
    return reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
