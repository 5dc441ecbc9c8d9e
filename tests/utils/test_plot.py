"""The plot command writes valid PNGs from a run's metrics.jsonl and explains bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from verl.utils.plot import PlotError, load_metrics, main
from verl.utils.tracking import Tracking

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not installed (pip install 'verl[loggers]')",
)


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's signature + IHDR chunk; fails on anything else."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    assert data.endswith(b"IEND\xaeB`\x82")  # the file was written to the end
    return struct.unpack(">II", data[16:24])


def _write_run(run_dir: Path, steps: int = 6) -> None:
    with Tracking("p", "e", "file", log_dir=run_dir) as tracker:
        for step in range(1, steps + 1):
            metrics = {
                "critic/score/mean": step / steps,
                "actor/entropy": 2.0 - step * 0.1,
                "actor/ppo_kl": 0.01 * step,
                "response_length/mean": 10.0 + step,
                "perf/throughput": 100.0,
            }
            if step % 3 == 0:
                metrics["val-core/arith/acc/mean@1"] = step / 10
            tracker.log(metrics, step=step)


def test_plot_writes_pngs_and_prints_their_paths(tmp_path, capsys):
    _write_run(tmp_path / "run")
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "plots")]) == 0
    printed = [line.removeprefix("wrote ") for line in capsys.readouterr().out.splitlines()]
    names = {Path(p).name for p in printed}
    assert names == {
        "reward.png",
        "val_score.png",
        "kl.png",
        "entropy.png",
        "response_length.png",
        "throughput.png",
        "overview.png",
    }
    for path in printed:
        width, height = _png_size(Path(path))
        assert width > 200 and height > 200


def test_only_panels_with_data_are_drawn_and_default_out_is_next_to_the_file(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "critic/score/mean": 0.1}) + "\n")
    assert main([str(path)]) == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["overview.png", "reward.png"]


def test_resumed_run_keeps_the_last_value_per_step_and_skips_nulls(tmp_path):
    lines = [
        {"step": 1, "critic/score/mean": 0.1},
        {"step": 2, "critic/score/mean": 0.2, "actor/pg_loss": None},
        {"step": 2, "critic/score/mean": 0.25},  # logged again after a resume
        {"step": 3, "critic/score/mean": 0.3},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    series = load_metrics(tmp_path)
    assert series["critic/score/mean"] == [(1, 0.1), (2, 0.25), (3, 0.3)]
    assert "actor/pg_loss" not in series


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("", "empty"),
        ('{"step": 1, "a": 1}\nnot json\n', "metrics.jsonl:2: not a JSON line"),
        ('{"a": 1}\n', "metrics.jsonl:1: expected an object with an integer 'step'"),
        ('{"step": 1, "unplotted": 1}\n', "none of the plotted metrics"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    assert main([str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(PlotError, match=message):
        from verl.utils.plot import plot_run

        plot_run(tmp_path)


def test_module_entry_point(tmp_path):
    _write_run(tmp_path, steps=2)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "verl.utils.plot", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"wrote {tmp_path / 'plots' / 'overview.png'}" in result.stdout
    _png_size(tmp_path / "plots" / "overview.png")
