"""Score a parquet of generated responses offline (verl's ``main_eval``).

One CPU (the file ``main_generation_server`` wrote for the built-in arithmetic task)::

    python -m verl.trainer.main_eval data.path=~/data/gen/arith.parquet

One GPU or a cluster: the same line (scoring runs on CPUs), e.g. for GSM8K generations with your
own scorer::

    python -m verl.trainer.main_eval data.path=~/data/gen/out.parquet \\
        custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score

Keys are those of verl's ``evaluation.yaml`` (``verl/trainer/config/evaluation.yaml``). Each row has
a list of responses (``data.response_key``), a data source (``data.data_source_key``) and a
``{"ground_truth": ...}`` dict (``data.reward_model_key``). Every response is scored as
``fn(data_source=..., solution_str=..., ground_truth=...)``: the custom function if
``custom_reward_function.path`` is set, else the built-in scorer of the row's data source
(:mod:`verl.utils.reward_score`). A scorer may return a number or a dict with ``score``. Printed and
returned: ``test_score/<data_source>``, the mean over that source's rows of each row's mean score.

Scoring runs in a pool of processes (:class:`~verl.workers.reward_manager.pool.ScoringPool`), not Ray tasks:
``ray_kwargs.ray_init.num_cpus`` processes (null: one per CPU), each call limited to
``score_timeout_s`` seconds. A call that raises or runs out of time scores 0 and is reported.
``ray_kwargs.timeline_json_file`` has no effect (there are no Ray tasks to trace).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from verl.config.base import POSITIVE, ConfigError, at_least, check, check_ranges, ranged
from verl.config.cli import check_argv, compose_config, user_errors_as_one_line
from verl.config.compat import check_known_keys, strip_schema_plus
from verl.config.hydra_schema import on_schema, register_schema
from verl.config.ppo_trainer import CONFIG_DIR
from verl.config.reward import CustomRewardFunctionConfig
from verl.trainer.offline_data import check_sequence, read_parquet_files, require_column, row_location
from verl.utils.dataset.schema import DatasetError
from verl.utils.reward_score import is_known_data_source
from verl.utils.reward_score.scorer_process import ScorerLoadError, ScorerSpec, load_function_from_file

logger = logging.getLogger(__name__)


@dataclass
class EvalDataConfig:
    path: str = "/tmp/math_Qwen2-7B-Instruct.parquet"
    """The parquet file to score (verl's default path; main_generation_server's data.output_path)."""
    prompt_key: str = "prompt"
    """Column of the prompts (not read: scores depend on the responses and the ground truth only)."""
    response_key: str = "responses"
    """Column with each row's list of generated responses."""
    data_source_key: str = "data_source"
    """Column whose value picks the built-in scorer and names the reported test_score/<data_source>."""
    reward_model_key: str = "reward_model"
    """Column with each row's {"ground_truth": ...} dict."""


@dataclass
class EvalRayInitConfig:
    num_cpus: int | None = ranged(None, at_least(1))
    """Scorer processes (verl: the CPUs Ray may use); null: one per CPU of this machine."""


@dataclass
class RayKwargsConfig:
    ray_init: EvalRayInitConfig = field(default_factory=EvalRayInitConfig)
    """verl's arguments of ray.init; here num_cpus sizes the scoring pool."""
    timeline_json_file: str | None = None
    """verl: a Ray timeline of the scoring tasks. No effect here: scoring runs in a process pool."""


@dataclass
class EvalConfig:
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    """The file to score and its columns."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """Your scorer, called as fn(data_source, solution_str, ground_truth, **reward_kwargs); path null: built-in ones."""
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    """How many processes score."""
    score_timeout_s: float = ranged(60.0, POSITIVE)
    """Not in verl: seconds one scorer call may take; a call past it scores 0 and its process is replaced."""

    def validate(self) -> None:
        check_ranges(self)
        data = self.data
        for name in ("response_key", "data_source_key", "reward_model_key"):
            check(bool(getattr(data, name)), f"data.{name}", "a column name", getattr(data, name))
        self.custom_reward_function.validate("custom_reward_function")


register_schema("evaluation", EvalConfig)


def to_eval_config(cfg: DictConfig) -> EvalConfig:
    """The typed, validated config (a key added with ``+`` that the schema lacks is an error); a
    config plain Hydra composed without the schema registered is merged onto it first."""
    cfg = on_schema(cfg, EvalConfig)
    check_known_keys(cfg)
    typed = OmegaConf.to_object(cfg)
    if not isinstance(typed, EvalConfig):
        raise ConfigError(f"expected an evaluation config, got {type(typed).__name__}")
    typed.validate()
    return typed


def load_eval_config(overrides: list[str] | None = None, config_dir: str = CONFIG_DIR) -> EvalConfig:
    """The config ``python -m verl.trainer.main_eval <overrides>`` runs with (for scripts and tests)."""
    overrides = strip_schema_plus(list(overrides or []), EvalConfig)
    return to_eval_config(compose_config(overrides, "evaluation", config_dir))


@dataclass
class ScoreCall:
    """One response to score, and the row it belongs to."""

    row: int
    data_source: str
    kwargs: dict[str, Any]


def read_score_calls(config: EvalConfig) -> list[ScoreCall]:
    """One call per response of every row of ``data.path``, with the row's source and ground truth."""
    data = config.data
    frame = read_parquet_files(data.path, "data.path")
    for key in ("response_key", "data_source_key", "reward_model_key"):
        require_column(frame, getattr(data, key), f"data.{key}", data.path)
    calls = []
    columns = (data.response_key, data.data_source_key, data.reward_model_key)
    for row, (responses, source, reward) in enumerate(zip(*(frame[c] for c in columns))):
        if isinstance(responses, str):
            responses = [responses]
        responses = check_sequence(
            responses, row_location("data.path", row, data.response_key), "a list of responses"
        )
        truth = reward.get("ground_truth") if isinstance(reward, dict) else None
        if truth is None:
            where = row_location("data.path", row, data.reward_model_key)
            raise DatasetError(f"{where}: expected a dict with a 'ground_truth', got {reward!r:.80}")
        truth = truth.tolist() if hasattr(truth, "tolist") else truth
        for text in responses:
            kwargs = {"data_source": source, "solution_str": str(text), "ground_truth": truth}
            calls.append(ScoreCall(row, str(source), kwargs))
    return calls


def scorer_spec(config: EvalConfig, data_sources: set[str]) -> ScorerSpec:
    """The custom function, or the built-in scorers, which must know every data source of the file."""
    custom = config.custom_reward_function
    if custom.path:
        try:  # here once, so that a bad path or name fails before any process starts
            load_function_from_file(custom.path, custom.name)
        except ScorerLoadError as error:
            raise ConfigError(str(error)) from None
        return ScorerSpec(kind="file", path=custom.path, name=custom.name, kwargs=dict(custom.reward_kwargs))
    unknown = sorted(s for s in data_sources if not is_known_data_source(s))
    if unknown:
        raise DatasetError(
            f"data.path: no built-in scorer for data source(s) {unknown} (column "
            f"{config.data.data_source_key!r}); set custom_reward_function.path to score them"
        )
    return ScorerSpec(kind="default")


def run_eval(config: EvalConfig) -> dict[str, float]:
    """Score every response of ``data.path``; returns (and prints) ``test_score/<data_source>``."""
    from verl.workers.reward_manager.pool import ScoringPool

    if config.ray_kwargs.timeline_json_file:
        logger.warning(
            "config note: ray_kwargs.timeline_json_file has no effect (no Ray tasks: a process pool scores)"
        )
    calls = read_score_calls(config)
    spec = scorer_spec(config, {c.data_source for c in calls})
    workers = min(config.ray_kwargs.ray_init.num_cpus or os.cpu_count() or 1, len(calls))
    with ScoringPool(spec, num_workers=workers, timeout_s=config.score_timeout_s) as pool:
        outcomes = pool.map([c.kwargs for c in calls])
    scores = [_score_of(o, c, config) for o, c in zip(outcomes, calls)]
    metrics = mean_scores_by_source(calls, scores)
    print(metrics, flush=True)
    return metrics


def _score_of(outcome: Any, call: ScoreCall, config: EvalConfig) -> float:
    """The number a scorer returned (a dict's ``score``); a failed call scores 0 and is logged."""
    if outcome.status != "ok":
        first_line = (outcome.message.strip().splitlines() or [""])[-1]
        logger.warning("data.path row %d: scorer call %s, scored 0: %s", call.row, outcome.status, first_line)
        return 0.0
    value = outcome.value["score"] if isinstance(outcome.value, dict) else outcome.value
    try:
        return float(value)
    except (TypeError, ValueError):
        where = config.custom_reward_function.path or "the built-in scorer"
        raise DatasetError(
            f"{where} returned {outcome.value!r:.80}, not a number or a dict with 'score'"
        ) from None


def mean_scores_by_source(calls: list[ScoreCall], scores: list[float]) -> dict[str, float]:
    """``test_score/<source>``: the mean over the source's rows of the row's mean score (verl's rule),
    sources in the order they first appear."""
    rows: dict[int, list[float]] = {}
    source_of: dict[int, str] = {}
    for call, score in zip(calls, scores):
        rows.setdefault(call.row, []).append(score)
        source_of[call.row] = call.data_source
    by_source: dict[str, list[float]] = {}
    for row, row_scores in rows.items():
        by_source.setdefault(source_of[row], []).append(sum(row_scores) / len(row_scores))
    return {f"test_score/{source}": sum(means) / len(means) for source, means in by_source.items()}


@hydra.main(config_path="config", config_name="evaluation", version_base=None)
def main(cfg: DictConfig) -> None:
    with user_errors_as_one_line():
        run_eval(to_eval_config(cfg))


def _load_for_cfg(overrides: list[str], name: str, directory: str) -> None:
    to_eval_config(compose_config(overrides, name, directory))


if __name__ == "__main__":
    sys.argv[1:] = check_argv(
        strip_schema_plus(sys.argv[1:], EvalConfig), "evaluation", CONFIG_DIR, _load_for_cfg
    )
    main()
