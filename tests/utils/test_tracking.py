"""Each logger writes what a user opens: a jsonl, TensorBoard events, a wandb run, an mlflow run."""

from __future__ import annotations

import glob
import importlib.util
import json
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.utils import tracking
from verl.utils.tracking import Tracking, TrackingError, select_generations

# numpy scalars and 0-d tensors, as the trainer produces them
STEP_METRICS = {
    "critic/score/mean": np.float32(0.5),
    "actor/lr": 1e-6,
    "val-core/arith/acc/mean@4": torch.tensor(0.25),
    "perf/total_num_tokens": np.int64(1234),
}


def _needs(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason=f"{module} is not installed (pip install 'verl[loggers]')",
    )


# ---------------------------------------------------------------------------- start-up checks
def test_unknown_logger_is_an_error_listing_the_valid_ones(tmp_path):
    with pytest.raises(
        TrackingError, match=r"unknown logger 'neptune'.*console, file, tensorboard, wandb, mlflow"
    ):
        Tracking("p", "e", ["console", "neptune"], log_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing started before the check


def test_missing_package_is_an_error_naming_the_pip_package(tmp_path, monkeypatch):
    monkeypatch.setitem(tracking._REQUIREMENTS, "mlflow", (("verl_no_such_module_xyz",), "mlflow-skinny"))
    with pytest.raises(TrackingError, match=r"'mlflow' logger needs the 'mlflow-skinny' package"):
        Tracking("p", "e", ["file", "mlflow"], log_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_non_scalar_metric_names_its_key(tmp_path):
    with (
        Tracking("p", "e", "file", log_dir=tmp_path) as tracker,
        pytest.raises(TrackingError, match="'actor/x'"),
    ):
        tracker.log({"actor/x": torch.ones(3)}, step=1)


def test_log_after_finish_is_an_error_and_finish_twice_is_fine(tmp_path):
    tracker = Tracking("p", "e", "file", log_dir=tmp_path)
    tracker.finish()
    tracker.finish()
    with pytest.raises(TrackingError, match="after finish"):
        tracker.log({"a": 1.0}, step=1)


# ---------------------------------------------------------------------------- console and file
def test_console_prints_one_line_per_step(capsys):
    with Tracking("p", "e", "console") as tracker:
        tracker.log(STEP_METRICS, step=3)
    line = capsys.readouterr().out.strip()
    assert line == (
        "step:3 - critic/score/mean:0.500 - actor/lr:1.000e-06 - val-core/arith/acc/mean@4:0.250"
        " - perf/total_num_tokens:1234"
    )


def test_file_writes_one_json_object_per_step_and_a_resumed_run_appends(tmp_path):
    with Tracking("p", "e", ["file"], log_dir=tmp_path) as tracker:
        tracker.log(STEP_METRICS, step=1)
        tracker.log({"critic/score/mean": 0.75, "actor/pg_loss": float("nan")}, step=2)
    with Tracking("p", "e", ["file"], log_dir=tmp_path) as tracker:  # resume
        tracker.log({"critic/score/mean": 1.0}, step=3)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[0] == {
        "step": 1,
        "critic/score/mean": 0.5,
        "actor/lr": 1e-6,
        "val-core/arith/acc/mean@4": 0.25,
        "perf/total_num_tokens": 1234,
    }
    assert records[1] == {"step": 2, "critic/score/mean": 0.75, "actor/pg_loss": None}  # NaN -> null
    assert records[2] == {"step": 3, "critic/score/mean": 1.0}


def test_generations_go_to_a_jsonl_and_the_console(tmp_path, capsys):
    samples = [("1+1=", "2", 1.0), ("2+2=", "5", np.float64(0.0))]
    with Tracking("p", "e", ["console", "file"], log_dir=tmp_path) as tracker:
        tracker.log_generations(samples, step=7)
    rows = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 7, "input": "1+1=", "output": "2", "score": 1.0},
        {"step": 7, "input": "2+2=", "output": "5", "score": 0.0},
    ]
    out = capsys.readouterr().out
    assert "'1+1='" in out and "score=0.0" in out


def test_select_generations_is_deterministic_and_independent_of_input_order():
    inputs, outputs, scores = ["c", "a", "b", "d"], ["C", "A", "B", "D"], [3.0, 1.0, 2.0, 4.0]
    picked = select_generations(inputs, outputs, scores, n=2)
    assert len(picked) == 2 and all(out == inp.upper() for inp, out, _ in picked)
    assert select_generations(inputs[::-1], outputs[::-1], scores[::-1], n=2) == picked


# ---------------------------------------------------------------------------- tensorboard
def _tensorboard_events(path: Path):
    """Events of a TFRecord file: records of [u64 length][u32 crc][Event proto][u32 crc]."""
    from tensorboardX.proto import event_pb2

    data, pos = path.read_bytes(), 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        yield event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
        pos += 12 + length + 4


def _read_tensorboard_scalars(event_dir: Path) -> dict[str, tuple[int, float]]:
    scalars = {}
    for path in sorted(event_dir.glob("events.out.tfevents.*")):
        for event in _tensorboard_events(path):
            scalars.update(
                {
                    v.tag: (event.step, v.simple_value)
                    for v in event.summary.value
                    if v.HasField("simple_value")
                }
            )
    return scalars


@_needs("tensorboardX")
def test_tensorboard_scalars_read_back(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    with Tracking("p", "e", "tensorboard", log_dir=tmp_path) as tracker:
        tracker.log(STEP_METRICS, step=5)
        tracker.log({"critic/score/mean": 0.875}, step=6)
        tracker.log_generations([("q", "a", 1.0)], step=6)
    scalars = _read_tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["critic/score/mean"] == (6, 0.875)
    assert scalars["perf/total_num_tokens"] == (5, 1234.0)
    step, lr = scalars["actor/lr"]
    assert step == 5 and math.isclose(lr, 1e-6, rel_tol=1e-6)  # stored as float32


# ---------------------------------------------------------------------------- wandb
def _read_wandb_history(run_file: Path) -> list[dict]:
    """History rows of an offline ``run-*.wandb`` file.

    The file is a 7-byte header then LevelDB-log records (32 KiB blocks; each record:
    u32 crc, u16 length, u8 type 1=full 2=first 3=middle 4=last) of ``Record`` protos.
    """
    from wandb.proto import wandb_internal_pb2

    data, block, pos, chunk, rows = run_file.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer too small for a header: zero padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record.FromString(chunk)
            if record.WhichOneof("record_type") == "history":
                items = record.history.item  # names are stored in `key` or split into `nested_key`
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
            chunk = b""
    return rows


@_needs("wandb")
def test_wandb_offline_run_directory_holds_the_metrics(tmp_path, monkeypatch):
    for var, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(var, value)
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home" / var.lower()))  # keep ~ clean
    with Tracking(
        "proj", "exp", "wandb", config={"trainer": {"total_epochs": 2}}, log_dir=tmp_path
    ) as tracker:
        tracker.log(STEP_METRICS, step=1)
        tracker.log({"critic/score/mean": 0.75}, step=2)
        tracker.log_generations([("1+1=", "2", 1.0)], step=2)
    run_dirs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(run_dirs) == 1
    run_file = next(Path(run_dirs[0]).glob("run-*.wandb"))
    # wandb's service process may still be writing the file when finish() returns (seen once in
    # 40 runs): read it until both rows are there, with a deadline that only catches a hang
    deadline = time.monotonic() + 60
    while len(by_step := {row["_step"]: row for row in _read_wandb_history(run_file)}) < 2:
        assert time.monotonic() < deadline, (
            f"{run_file} holds {sorted(by_step)} after 60 s, expected steps 1 and 2"
        )
        time.sleep(0.2)
    assert by_step[1]["critic/score/mean"] == 0.5 and by_step[1]["val-core/arith/acc/mean@4"] == 0.25
    assert by_step[2]["critic/score/mean"] == 0.75
    tables = list(Path(run_dirs[0]).glob("files/media/table/val/generations_*.table.json"))
    assert json.loads(tables[0].read_text())["data"] == [[2, "1+1=", "2", 1.0]]


# ---------------------------------------------------------------------------- mlflow
def _mlflow_run(uri: str, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1
    return client, runs[0]


@_needs("mlflow")
def test_mlflow_local_file_store_run_has_metrics_and_params(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "unset")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # absent now, restored to absent afterwards
    config = {"algorithm": {"adv_estimator": "grpo"}, "trainer": {"total_epochs": 2}}
    with Tracking("proj", "exp", "mlflow", config=config, log_dir=tmp_path) as tracker:
        tracker.log(STEP_METRICS, step=1)
        tracker.log({"critic/score/mean": 0.75}, step=2)
        tracker.log_generations([("1+1=", "2", 1.0)], step=2)
    client, run = _mlflow_run(f"file:{tmp_path / 'mlruns'}", "proj")
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert run.data.metrics["val-core/arith/acc/mean_at_4"] == 0.25  # '@' is not allowed by mlflow
    assert run.data.params["algorithm.adv_estimator"] == "grpo"
    text = client.download_artifacts(run.info.run_id, "generations/step_2.json", str(tmp_path / "dl"))
    assert json.loads(Path(text).read_text()) == [{"input": "1+1=", "output": "2", "score": 1.0}]


@_needs("mlflow")
def test_mlflow_honours_tracking_uri(tmp_path, monkeypatch):
    uri = f"file:{tmp_path / 'elsewhere'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with Tracking("proj2", "exp2", "mlflow", log_dir=tmp_path / "run") as tracker:
        tracker.log({"actor/entropy": 1.5}, step=4)
    _, run = _mlflow_run(uri, "proj2")
    assert run.data.metrics["actor/entropy"] == 1.5
    assert not (tmp_path / "run" / "mlruns").exists()
