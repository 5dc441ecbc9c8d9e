"""The same GRPO training step on the FSDP and the Megatron engine: step time and peak memory.

    python benchmarks/megatron_vs_fsdp.py                 # CPU: a small Qwen2 shape, fp32
    python benchmarks/megatron_vs_fsdp.py --gpu           # one CUDA GPU: the Qwen2.5-0.5B shape, bf16

Each engine runs in a fresh process of its own (megatron-core's parallel state is per process) the
real ``ActorRolloutRefWorker``: the old-log-prob pass and one actor update over random full-length
responses (what was sampled does not change the update's cost), a warm-up step first, then the
median of ``--steps``. Prints each engine's seconds, tokens/s and peak memory (CUDA: allocated by
torch; CPU: the process's peak resident set), the ratio Megatron / FSDP, and on a GPU the update's
MFU. On CPU megatron-core needs the test-only shim (``tests/megatron/cpu_shim.py``), which this
benchmark installs in its Megatron process, as the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
CPU_SHAPE = dict(layers=4, hidden=256, intermediate=768, heads=4, kv_heads=2, vocab=4096)
CPU_BATCH = dict(prompts=8, n=4, prompt_length=32, response_length=64, micro=8)
GPU_SHAPE = dict(layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936)
GPU_BATCH = dict(prompts=32, n=4, prompt_length=128, response_length=256, micro=16)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def peak_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def engine_overrides(engine: str, gpu: bool) -> list[str]:
    if engine == "fsdp":
        return []
    keys = ["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.ref.strategy=megatron"]
    return keys + (["actor_rollout_ref.actor.megatron.use_distributed_optimizer=True"] if gpu else [])


def one_step(worker, config, args) -> dict[str, float]:
    from benchmarks.gpu_step import prompt_batch, random_responses
    from verl.algorithms.advantages import compute_advantage_for

    batch = prompt_batch(args, worker.tokenizer.pad_token_id)
    prompts = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
    batch.union(random_responses(prompts, args))
    sync()
    start = time.perf_counter()
    lp = worker.compute_log_prob(batch)
    sync()
    log_prob_s = time.perf_counter() - start
    batch.union(lp.select(batch_keys=["old_log_probs"]))
    rewards = torch.zeros(batch.batch["response_mask"].shape)
    rewards[:, -1] = torch.rand(len(rewards), generator=torch.Generator().manual_seed(2))
    batch.batch["token_level_rewards"] = rewards
    algo = config.algorithm
    compute_advantage_for(batch, algo)
    start = time.perf_counter()
    worker.update_actor(batch)
    sync()
    return {
        "log_prob_s": log_prob_s,
        "update_s": time.perf_counter() - start,
        "tokens": float(batch.batch["attention_mask"].sum()),
    }


def run_engine(args) -> dict[str, float]:
    """This process: one engine, warm-up + ``args.steps`` steps; the medians and the peak memory."""
    from benchmarks.gpu_step import build_model_dir, start_worker

    if args.engine == "megatron" and not args.gpu:
        from tests.megatron.cpu_shim import install

        install()
    path = build_model_dir(args)
    args.override = engine_overrides(args.engine, args.gpu) + args.override
    if args.gpu:
        args.override.append("actor_rollout_ref.actor.fsdp_config.model_dtype=fp32")
    worker, config = start_worker(path, args, "cuda" if args.gpu else "cpu")
    one_step(worker, config, args)  # warm-up: allocates the optimizer state
    runs = [one_step(worker, config, args) for _ in range(args.steps)]
    out = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}
    out["peak_gib"] = peak_gib()
    out["params"] = float(worker.param_count)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="one CUDA GPU, the 0.5B shape in bf16")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--engine", choices=["fsdp", "megatron"], help=argparse.SUPPRESS)
    p.add_argument("--override", action="append", default=[], help="a config key=value (repeatable)")
    args = p.parse_args()
    for key, value in {
        **(GPU_SHAPE if args.gpu else CPU_SHAPE),
        **(GPU_BATCH if args.gpu else CPU_BATCH),
    }.items():
        setattr(args, key, value)
    args.remove_padding, args.no_generate, args.profile = False, True, False
    if args.engine:
        print("RESULT " + json.dumps(run_engine(args)))
        return
    results = {}
    for engine in ("fsdp", "megatron"):
        cmd = [sys.executable, __file__, "--engine", engine, "--steps", str(args.steps)]
        cmd += ["--gpu"] if args.gpu else []
        cmd += [f"--override={o}" for o in args.override]
        done = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{engine} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        results[engine] = json.loads(line[len("RESULT ") :])
    report(results, args)


def report(results: dict, args) -> None:
    device = torch.cuda.get_device_name() if args.gpu else "CPU"
    params = results["fsdp"]["params"]
    print(
        f"device: {device}; model {params / 1e6:.0f}M params; {args.prompts * args.n} sequences of ", end=""
    )
    print(f"{args.prompt_length}+{args.response_length} tokens; {'bf16' if args.gpu else 'fp32'}")
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device), None)
    for engine, r in results.items():
        line = f"{engine:9s} log_prob {r['log_prob_s']:7.2f} s  update {r['update_s']:7.2f} s "
        line += f"({r['tokens'] / r['update_s']:8.0f} tok/s)  peak {r['peak_gib']:6.2f} GiB"
        if peak:
            line += f"  update MFU {6 * params * r['tokens'] / r['update_s'] / (peak * 1e12):.3f}"
        print(line)
    m, f = results["megatron"], results["fsdp"]
    print(
        f"ratio megatron / fsdp: log_prob {m['log_prob_s'] / f['log_prob_s']:.2f}, "
        f"update {m['update_s'] / f['update_s']:.2f}, peak memory {m['peak_gib'] / f['peak_gib']:.2f}"
    )


if __name__ == "__main__":
    main()
