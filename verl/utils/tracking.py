"""Experiment tracking: one ``Tracking`` object fans each step's metrics out to the loggers
listed in ``trainer.logger``.

Backends and where they write (``log_dir`` is the ``log_dir`` argument, or
``logs/<project_name>/<experiment_name>`` under the current directory when it is ``None``):

* ``console``: one line per step, ``step:N - name:value - ...``.
* ``file``: ``<log_dir>/metrics.jsonl``, one JSON object per step (``{"step": N, "<name>": value}``),
  appended and flushed each step so that a resumed run continues the same file; non-finite
  values are written as ``null``. Sample generations go to ``<log_dir>/generations.jsonl``.
* ``tensorboard``: event files under ``<log_dir>/tensorboard`` (or ``$TENSORBOARD_DIR``, as in verl).
  Needs ``tensorboardX`` (or ``tensorboard``, used through ``torch.utils.tensorboard``).
* ``wandb``: a run under ``<log_dir>/wandb``; ``WANDB_MODE=offline`` works without an account.
* ``mlflow``: ``$MLFLOW_TRACKING_URI`` if set, else the local file store ``file:<log_dir>/mlruns``
  (MLflow 3 refuses file stores unless ``MLFLOW_ALLOW_FILE_STORE=true``; we set it for that
  default only). Experiment = ``project_name``, run name = ``experiment_name``.

Every backend is checked when ``Tracking`` is built: an unknown name or a missing package is
an error at start-up, never at the first ``log`` call.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

__all__ = ["VALID_BACKENDS", "Tracking", "TrackingError", "select_generations", "to_scalars"]

VALID_BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow")
# backend -> (modules, any of which provides it; the pip package to suggest when none is present)
_REQUIREMENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "tensorboard": (("tensorboardX", "tensorboard"), "tensorboardX"),
    "wandb": (("wandb",), "wandb"),
    "mlflow": (("mlflow",), "mlflow-skinny"),
}
_CONSOLE_SAMPLES = 3  # generations printed by the console logger per call

Sample = tuple[str, str, float]


class TrackingError(ValueError):
    """A logger cannot be set up, or a metric value cannot be logged."""


# ---------------------------------------------------------------------------- values
def _to_scalar(key: str, value: Any) -> int | float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TrackingError(
                f"metric {key!r}: expected a scalar, got a tensor of shape {tuple(value.shape)}"
            )
        value = value.item()
    elif isinstance(value, np.ndarray | np.generic):
        if np.size(value) != 1:
            raise TrackingError(f"metric {key!r}: expected a scalar, got an array of shape {np.shape(value)}")
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    raise TrackingError(f"metric {key!r}: expected a number, got {type(value).__name__} {value!r}")


def to_scalars(data: Mapping[str, Any]) -> dict[str, int | float]:
    """Python numbers for every metric (python/numpy scalars and one-element tensors accepted)."""
    return {str(key): _to_scalar(str(key), value) for key, value in data.items()}


def _format_value(value: float) -> str:
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 1e15):
        return str(int(value))
    if math.isfinite(value) and 1e-3 <= abs(value) < 1e6:
        return f"{value:.3f}"
    return f"{value:.3e}"


def _plain_config(config: Any) -> dict[str, Any]:
    """A plain nested dict from a dataclass, an OmegaConf config or a mapping."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(config, resolve=True)
    if isinstance(config, Mapping):
        return dict(config)
    raise TrackingError(
        f"config: expected a dataclass, a dict or an OmegaConf config, got {type(config).__name__}"
    )


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def select_generations(
    inputs: list[str], outputs: list[str], scores: list[float], n: int, seed: int = 42
) -> list[Sample]:
    """``n`` (input, output, score) samples for ``trainer.log_val_generations``.

    As in verl: sort by input, shuffle with a fixed seed, take the first ``n``, so the same
    prompts are shown at every validation and their outputs can be compared over training.
    """
    samples = sorted(zip(inputs, outputs, scores), key=lambda sample: sample[0])
    order = np.random.RandomState(seed).permutation(len(samples))
    return [samples[i] for i in order[:n]]


# ---------------------------------------------------------------------------- backends
class _Console:
    def log(self, data: dict[str, float], step: int) -> None:
        parts = [f"step:{step}"] + [f"{key}:{_format_value(value)}" for key, value in data.items()]
        # tqdm.write keeps the line from tearing a progress bar drawn on the same terminal
        tqdm.write(" - ".join(parts))

    def log_generations(self, samples: list[Sample], step: int) -> None:
        for i, (prompt, output, score) in enumerate(samples[:_CONSOLE_SAMPLES]):
            tqdm.write(f"[step {step} sample {i}] score={score}\n  input: {prompt!r}\n  output: {output!r}")

    def finish(self) -> None:
        pass


class _File:
    def __init__(self, log_dir: Path):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.path = log_dir / "metrics.jsonl"
        self.generations_path = log_dir / "generations.jsonl"
        # append: a resumed run continues the file (the plot keeps the last value per step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)

    def log(self, data: dict[str, float], step: int) -> None:
        record: dict[str, Any] = {"step": step}
        # strict JSON has no NaN/Infinity; null keeps the file readable by every JSON tool
        record.update({k: (v if math.isfinite(v) else None) for k, v in data.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_generations(self, samples: list[Sample], step: int) -> None:
        with open(self.generations_path, "a", encoding="utf-8") as f:
            for prompt, output, score in samples:
                f.write(json.dumps({"step": step, "input": prompt, "output": output, "score": score}) + "\n")

    def finish(self) -> None:
        self._file.close()


class _TensorBoard:
    def __init__(self, log_dir: Path):
        self.path = Path(os.environ.get("TENSORBOARD_DIR") or log_dir / "tensorboard")
        self.path.mkdir(parents=True, exist_ok=True)
        if importlib.util.find_spec("tensorboardX") is not None:
            from tensorboardX import SummaryWriter
        else:
            from torch.utils.tensorboard import SummaryWriter
        self._writer = SummaryWriter(str(self.path))

    def log(self, data: dict[str, float], step: int) -> None:
        for key, value in data.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()  # the default flushes every 2 minutes; a crash would lose them

    def log_generations(self, samples: list[Sample], step: int) -> None:
        blocks = [f"**score {s}**\n\n    {p}\n\n    {o}" for p, o, s in samples]
        self._writer.add_text("val/generations", "\n\n---\n\n".join(blocks), step)
        self._writer.flush()

    def finish(self) -> None:
        self._writer.close()


class _Wandb:
    def __init__(self, project: str, experiment: str, config: dict[str, Any], log_dir: Path):
        import wandb

        self.path = log_dir / "wandb"
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            self._run = wandb.init(project=project, name=experiment, config=config, dir=str(log_dir))
        except Exception as err:
            raise TrackingError(
                f"trainer.logger: wandb could not start ({err}); run `wandb login`, or set WANDB_MODE=offline"
            ) from err
        self._table_rows: list[list[Any]] = []

    def log(self, data: dict[str, float], step: int) -> None:
        self._run.log(data, step=step)

    def log_generations(self, samples: list[Sample], step: int) -> None:
        import wandb

        # a logged wandb.Table is frozen, so each call logs a new table with all rows so far
        self._table_rows += [[step, p, o, s] for p, o, s in samples]
        table = wandb.Table(columns=["step", "input", "output", "score"], data=self._table_rows)
        self._run.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self._run.finish()


def _mlflow_name(key: str) -> str:
    """MLflow names allow only ``[/\\w.\\- :]``; ``@`` becomes ``_at_`` as in verl (mean@4 -> mean_at_4)."""
    return re.sub(r"[^/\w.\- :]", "_", key.replace("@", "_at_"))


class _Mlflow:
    _BATCH = 100  # MLflow accepts at most 100 params and 1000 metrics per log_batch call

    def __init__(self, project: str, experiment: str, config: dict[str, Any], log_dir: Path):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            (log_dir / "mlruns").mkdir(parents=True, exist_ok=True)
            uri = f"file:{(log_dir / 'mlruns').resolve()}"
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        found = self._client.get_experiment_by_name(project)
        experiment_id = found.experiment_id if found else self._client.create_experiment(project)
        self.run_id = self._client.create_run(experiment_id, run_name=experiment).info.run_id
        params = [Param(_mlflow_name(k), str(v)[:6000]) for k, v in _flatten(config).items()]
        for start in range(0, len(params), self._BATCH):
            self._client.log_batch(self.run_id, params=params[start : start + self._BATCH])

    def log(self, data: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_name(k), float(v), now, step) for k, v in data.items()]
        for start in range(0, len(metrics), 10 * self._BATCH):
            self._client.log_batch(self.run_id, metrics=metrics[start : start + 10 * self._BATCH])

    def log_generations(self, samples: list[Sample], step: int) -> None:
        rows = [{"input": p, "output": o, "score": s} for p, o, s in samples]
        self._client.log_text(self.run_id, json.dumps(rows, indent=1), f"generations/step_{step}.json")

    def finish(self) -> None:
        self._client.set_terminated(self.run_id)


# ---------------------------------------------------------------------------- front
def _check_backends(backends: Iterable[str]) -> list[str]:
    """Deduplicated names; unknown names and missing packages raise before anything starts."""
    names = list(dict.fromkeys(str(b) for b in backends))
    for name in names:
        if name not in VALID_BACKENDS:
            raise TrackingError(
                f"trainer.logger: unknown logger {name!r}; valid loggers: {', '.join(VALID_BACKENDS)}"
            )
    for name in names:
        modules, package = _REQUIREMENTS.get(name, ((), ""))
        if modules and not any(importlib.util.find_spec(m) is not None for m in modules):
            raise TrackingError(
                f"trainer.logger: the {name!r} logger needs the {package!r} package: "
                f"pip install {package}  (or pip install 'verl[loggers]')"
            )
    return names


class Tracking:
    """Log metrics to every backend in ``default_backend`` (see the module doc for where each writes).

    verl's constructor, ``Tracking(project_name, experiment_name, default_backend="console",
    config=None)``: ``default_backend`` is a name or a list of names from :data:`VALID_BACKENDS`;
    ``config`` (a dataclass, an OmegaConf config or a dict) is recorded by wandb and mlflow.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: str | list[str] = "console",
        config: Any = None,
        log_dir: str | os.PathLike | None = None,
    ):
        names = _check_backends([default_backend] if isinstance(default_backend, str) else default_backend)
        self.log_dir = Path(log_dir) if log_dir is not None else Path("logs") / project_name / experiment_name
        plain = _plain_config(config)
        self.backends: dict[str, Any] = {}
        try:
            for name in names:
                self.backends[name] = self._build(name, project_name, experiment_name, plain)
        except Exception:
            self.finish()  # close what already started, then report the failure
            raise
        self._finished = False

    def _build(self, name: str, project: str, experiment: str, config: dict[str, Any]) -> Any:
        if name == "console":
            return _Console()
        if name == "file":
            return _File(self.log_dir)
        if name == "tensorboard":
            return _TensorBoard(self.log_dir)
        if name == "wandb":
            return _Wandb(project, experiment, config, self.log_dir)
        return _Mlflow(project, experiment, config, self.log_dir)

    @property
    def logger(self) -> dict[str, Any]:
        """Backend name -> its logger (verl's attribute name)."""
        return self.backends

    def log(self, data: Mapping[str, Any], step: int, backend: str | list[str] | None = None) -> None:
        """Log one step's flat metrics (``{"critic/score/mean": 0.5, ...}``) to every backend, or to
        those named by ``backend``."""
        if self._finished:
            raise TrackingError("Tracking.log() called after finish()")
        scalars = to_scalars(data)
        chosen = [backend] if isinstance(backend, str) else backend
        for name, logger in self.backends.items():
            if chosen is None or name in chosen:
                logger.log(scalars, int(step))

    def log_generations(self, samples: list[Sample], step: int) -> None:
        """Log (input, output, score) samples: a jsonl file, a wandb table, TensorBoard text, ..."""
        rows = [(str(p), str(o), float(_to_scalar("score", s))) for p, o, s in samples]
        for backend in self.backends.values():
            backend.log_generations(rows, int(step))

    def finish(self) -> None:
        """Flush and close every backend (safe to call twice)."""
        for backend in self.backends.values():
            backend.finish()
        self.backends = {}
        self._finished = True

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()
