"""Ulysses sequence parallelism for real: two gloo ranks (``torchrun``) split each packed sequence
of a tiny Qwen2 between them, and give the log-probs, entropies and gradients of one rank
(``ulysses_ranks.py``; with 2 key/value heads, split as they are, and with 1, repeated first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_two_ranks_splitting_each_sequence_equal_one_rank(tmp_path):
    report = tmp_path / "report.json"
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(REPO / "tests" / "workers" / "ulysses_ranks.py"),
            str(report),
        ],
        env={**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for case, diffs in json.loads(report.read_text()).items():
        # attention of each head runs whole on one rank, everything else per token: the outputs are
        # the same numbers; gradients differ by the order of the group's sum only
        assert diffs["log_probs"] < 1e-6 and diffs["entropys"] < 1e-6, (case, diffs)
        assert diffs["grads"] < 1e-5 * diffs["grad_scale"], (case, diffs)
