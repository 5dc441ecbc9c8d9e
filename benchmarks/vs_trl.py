"""GRPO on SmolLM2-135M-Instruct: this framework's step time against TRL's GRPOTrainer doing the same work.

    python3 -m venv /tmp/trl-venv && /tmp/trl-venv/bin/pip install -c constraints.txt trl
    python benchmarks/vs_trl.py --trl-python /tmp/trl-venv/bin/python [--steps 3] [--rollouts hf,vllm]
        [--precision fp32|bf16]

The case: 8 offline GSM-style prompts a step (reasoning-gym's ``gsm_symbolic``, about 107 tokens with
SmolLM2's chat template) x 4 samples, at most 64 new tokens at temperature 1, a KL penalty to the
reference model in the loss (beta 0.04, the k3 estimator), one optimizer step per batch (AdamW,
lr 1e-6) on all 32 samples at once, fp32, no gradient checkpointing, 2 CPU threads. With
``--precision bf16`` both sides compute in bf16 under CPU autocast, weights kept fp32: TRL with
``bf16=True`` (accelerate wraps the model's forward, generation included, in autocast), ours with
``mixed_precision.cpu_autocast=True`` on the actor and the reference and ``rollout.use_dtype_on_cpu=True``
(the rollout's weights in bf16). TRL runs in its
own virtual environment (it is not a dependency of this project); both load the same converted model
folder and the same prompts. Ours runs ``python -m verl.trainer.main_ppo`` with the settings a user
would pick (prompts padded to ``data.max_prompt_length=256``; not packed: on a CPU the packed path's
attention mask grows with the square of the micro-batch's tokens).

The runs go one after another, never sharing the CPU: ours with each rollout, then TRL. The first
step of every run is a warm-up and is not counted. Prints the median step time of each, the ratio
ours / TRL, and our phases (generation, reference, old log-prob, update).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PROMPTS, SAMPLES, NEW_TOKENS, BETA, LR, THREADS = 8, 4, 64, 0.04, 1e-6, 2
PHASES = ("timing_s/gen", "timing_s/ref", "timing_s/old_log_prob", "timing_s/update_actor")
BF16 = (
    *(f"actor_rollout_ref.{role}.fsdp_config.mixed_precision.cpu_autocast=True" for role in ("actor", "ref")),
    "actor_rollout_ref.rollout.use_dtype_on_cpu=True",
)

TRL_SCRIPT = textwrap.dedent(
    """
    import json, re, sys, time

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    spec = json.load(open(sys.argv[1]))
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)


    def gsm_reward(completions, answer, **_):
        scores = []
        for completion, truth in zip(completions, answer):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            found = re.findall(r"####\\s*(-?[0-9.,]+)", text)
            scores.append(float(bool(found) and found[-1].replace(",", "").rstrip(".") == truth))
        return scores


    class StepClock(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_train_begin(self, args, state, control, **_):
            self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **_):
            self.marks.append(time.perf_counter())


    config = GRPOConfig(
        output_dir=spec["output_dir"],
        per_device_train_batch_size=spec["prompts"] * spec["samples"],
        gradient_accumulation_steps=1,
        num_generations=spec["samples"],
        max_completion_length=spec["new_tokens"],
        temperature=1.0,
        beta=spec["beta"],
        learning_rate=spec["lr"],
        num_iterations=1,
        max_steps=spec["steps"],
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=spec["bf16"],
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        dataloader_num_workers=0,
        seed=0,
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=gsm_reward,
        args=config,
        train_dataset=Dataset.from_list(spec["rows"]),
        callbacks=[clock],
    )
    trainer.train()
    steps = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
    print("STEP_TIMES " + json.dumps(steps), flush=True)
    """
)


def prepare(workdir: Path) -> tuple[str, Path, list[dict]]:
    """The converted SmolLM2 folder, the prompts' parquet and the same prompts as TRL rows."""
    sys.path.insert(0, str(REPO))  # run as a script: examples/ is importable from the repository root
    from examples.data_preprocess.gsm_symbolic import main as write_gsm_symbolic
    from verl.utils.smollm import prepare_smollm2

    model = prepare_smollm2(
        Path(os.environ.get("VERL_CACHE_DIR", "~/.cache/verl")).expanduser() / "models" / "smollm2"
    )
    files = write_gsm_symbolic(
        ["--local_dir", str(workdir / "data"), "--train_size", "256", "--test_size", "16"]
    )
    frame = pd.read_parquet(files["train"])
    rows = [
        {
            "prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
            "answer": reward["ground_truth"],
        }
        for prompt, reward in zip(frame["prompt"], frame["reward_model"])
    ]
    return model, files["train"], rows


def run_ours(
    model: str, data: Path, rollout: str, steps: int, workdir: Path, extra: tuple[str, ...] = ()
) -> list[dict]:
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={PROMPTS}",
        "data.max_prompt_length=256",
        f"data.max_response_length={NEW_TOKENS}",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.rollout.name={rollout}",
        f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={PROMPTS * SAMPLES}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={PROMPTS * SAMPLES}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={PROMPTS * SAMPLES}",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.kl_loss_coef={BETA}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.actor.optim.lr={LR}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "trainer.n_gpus_per_node=1",
        f"trainer.cpus_per_worker={THREADS}",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[file]",
        "trainer.project_name=vs_trl",
        f"trainer.experiment_name={rollout}",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "", "RAY_worker_niceness": "0"}
    subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=workdir, env=env, check=True
    )
    lines = (workdir / "logs" / "vs_trl" / rollout / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def run_trl(
    python: str, model: str, rows: list[dict], steps: int, workdir: Path, bf16: bool = False
) -> list[float]:
    spec = {
        "bf16": bf16,
        "model": model,
        "rows": rows,
        "prompts": PROMPTS,
        "samples": SAMPLES,
        "new_tokens": NEW_TOKENS,
        "beta": BETA,
        "lr": LR,
        "steps": steps,
        "threads": THREADS,
        "output_dir": str(workdir / "trl"),
    }
    (workdir / "spec.json").write_text(json.dumps(spec))
    (workdir / "trl_grpo.py").write_text(TRL_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [python, str(workdir / "trl_grpo.py"), str(workdir / "spec.json")],
        cwd=workdir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("STEP_TIMES "))
    return json.loads(line.removeprefix("STEP_TIMES "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", required=True, help="the python of a virtual environment with trl")
    parser.add_argument("--steps", type=int, default=3, help="steps per run (the first is a warm-up)")
    parser.add_argument("--rollouts", default="hf,vllm", help="our rollouts to measure, comma-separated")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="both sides' compute")
    args = parser.parse_args()
    bf16 = args.precision == "bf16"
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as root:
        workdir = Path(root)
        model, data, rows = prepare(workdir)
        ours = {}
        for rollout in args.rollouts.split(","):
            metrics = run_ours(model, data, rollout, args.steps, workdir, BF16 if bf16 else ())[1:]
            ours[rollout] = (
                statistics.median(m["timing_s/step"] for m in metrics),
                {p: statistics.median(m.get(p, 0.0) for m in metrics) for p in PHASES},
            )
        trl = statistics.median(run_trl(args.trl_python, model, rows, args.steps, workdir, bf16)[1:])
    print(f"compute in {args.precision}")
    print(f"TRL GRPOTrainer: {trl:.1f} s/step (median of {args.steps - 1})")
    for rollout, (step, phases) in ours.items():
        detail = ", ".join(f"{p.split('/')[1]} {t:.1f} s" for p, t in phases.items())
        print(f"ours, rollout={rollout}: {step:.1f} s/step, ratio to TRL {step / trl:.2f} ({detail})")


if __name__ == "__main__":
    main()
