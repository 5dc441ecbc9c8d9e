"""examples/slurm/ray_on_slurm.sbatch, run with stand-ins for the Slurm commands (there is no
Slurm here): it starts Ray's head on the first node and a worker on each other node, checks the
environment with the doctor, and its main_ppo line is a valid config for the allocation."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from verl.config.ppo_trainer import load_config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "slurm" / "ray_on_slurm.sbatch"
# srun logs each call's arguments (one call per line, separated by the unit separator \x1f)
# instead of running them. The line is built first and appended with one write: the script runs
# several sruns in the background, and two appends per call could interleave with another call's.
FAKE_SRUN = '#!/usr/bin/env bash\nline=$(printf "%s\\037" "$@")\nprintf "%s\\n" "$line" >> "$SRUN_LOG"\n'
FAKE_SCONTROL = '#!/usr/bin/env bash\nprintf "node-a\\nnode-b\\nnode-c\\n"\n'


def test_the_sbatch_script_starts_ray_on_every_node_and_runs_a_valid_config(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "srun.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SRUN_LOG": str(log),
        "SLURM_JOB_NODELIST": "node-[a-c]",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_CPUS_PER_TASK": "16",
        "SLURM_GPUS_ON_NODE": "8",
        "RAY_START_WAIT_S": "0",
        "PYTHON": "python",
    }
    subprocess.run(["bash", str(SCRIPT), "trainer.total_epochs=1"], env=env, check=True, timeout=60)
    calls = [line.split("\x1f")[:-1] for line in log.read_text().splitlines() if line]
    starts = {c[c.index("-w") + 1]: c for c in calls if "start" in c}  # started in the background
    assert sorted(starts) == ["node-a", "node-b", "node-c"]
    assert "--head" in starts["node-a"]
    assert all(any(a.startswith("--address=") for a in starts[n]) for n in ("node-b", "node-c"))
    doctor = next(c for c in calls if "verl.doctor" in c)
    train = next(c for c in calls if "verl.trainer.main_ppo" in c)
    overrides = train[train.index("verl.trainer.main_ppo") + 1 :]
    assert overrides[-1] == "trainer.total_epochs=1"  # extra arguments are passed on
    assert set(doctor[doctor.index("verl.doctor") + 1 :]) <= set(overrides)  # the doctor checks that run
    config = load_config(overrides)
    assert config.trainer.nnodes == 3 and config.trainer.n_gpus_per_node == 8
    assert config.actor_rollout_ref.rollout.name == "vllm"
