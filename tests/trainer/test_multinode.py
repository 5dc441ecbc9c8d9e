"""Multi-node on Ray, for real: a 2-node cluster on this machine (two raylets, 1 CPU each; see
``multinode_cluster.py``), ``main_ppo`` with ``trainer.nnodes=2`` joining it.

One run trains a step with a rank on each node and checkpoints; a second run resumes from
that checkpoint, trains a step, and then the worker node is taken away mid-run: the run ends with
an error naming a dead rank's node and role instead of hanging.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUN = [
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
    "trainer.cpus_per_worker=1",
    "trainer.save_freq=1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=False",
    "trainer.logger=[console]",
    "trainer.project_name=multinode",
    "trainer.experiment_name=run",
    "data.train_batch_size=4",
    "data.val_max_samples=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
]
HANG_GUARD_S = 300  # only catches a hang


def env() -> dict[str, str]:
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": pythonpath, "RAY_ADDRESS": ""}


@pytest.fixture(scope="module")
def cluster(builtin_assets):
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "trainer" / "multinode_cluster.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    info = {}
    while len(info) < 2:
        line = proc.stdout.readline()
        assert line, "the cluster process ended before printing its address"
        key, value = line.split()
        info[key] = value
    yield proc, info["ADDRESS"], info["WORKER_NODE"]
    if proc.poll() is None:
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        proc.wait(timeout=120)


def main_ppo(workdir: Path, address: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "verl.trainer.main_ppo", f"ray_init.address={address}", *RUN, *extra],
        cwd=workdir,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_two_nodes_train_checkpoint_resume_and_a_lost_node_is_named(cluster, tmp_path):
    proc, address, worker_node = cluster

    first = main_ppo(tmp_path, address, "trainer.total_training_steps=1")
    out, _ = first.communicate(timeout=HANG_GUARD_S)
    assert first.returncode == 0, out[-3000:]
    placed = re.search(r"roles actor_rollout placed: rank 0: node (\w+) pid \d+, rank 1: node (\w+)", out)
    assert placed, out[-3000:]
    nodes = [placed.group(1), placed.group(2)]
    assert nodes[0] != nodes[1], nodes  # one rank on each node
    assert sum(worker_node.startswith(node) for node in nodes) == 1  # one rank on the worker node
    step_1 = tmp_path / "checkpoints" / "multinode" / "run" / "global_step_1"
    assert (step_1 / "actor").is_dir(), sorted(p.name for p in step_1.parent.iterdir())

    second = main_ppo(tmp_path, address, "trainer.total_training_steps=100")
    lines = []
    for line in second.stdout:  # resumed, then one more step, then the worker node goes away
        lines.append(line)
        if line.startswith("step:2 "):
            break
    assert any("resumed from" in line and "global_step_1" in line for line in lines), "".join(lines)[-3000:]
    proc.stdin.write("kill-worker\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "WORKER_REMOVED"
    start = time.monotonic()
    rest, _ = second.communicate(timeout=HANG_GUARD_S)
    elapsed = time.monotonic() - start
    assert second.returncode != 0
    # the lost rank dies, and its peer's collective often kills the peer's process too, so either
    # rank may be the one reported; the error names a dead rank's role, node and process
    lost = re.search(r"role 'actor_rollout' rank (\d) \(node (\w+), pid \d+\): worker process died", rest)
    assert lost, rest[-5000:]
    assert any(lost.group(2).startswith(node) for node in nodes), (lost.group(2), nodes)
    print(f"the run ended {elapsed:.1f}s after the node was removed")
