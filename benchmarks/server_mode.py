"""Server mode (``rollout.mode=async``) against batched generation (``sync``), same engine, same prompts.

    .venv/bin/python benchmarks/server_mode.py [--rows 128] [--response_length 32] [--repeats 3]

For each engine (hf, vllm) on the built-in 0.8M model and the ~28M model of
``rollout_throughput.py``, in a fresh process each:

* **overhead**: tokens/s of one batched ``generate_sequences`` call against the same batch sent
  as one HTTP request per row to the engine's server (``ServerRolloutClient`` -> loopback
  ``/generate`` -> continuous batching); EOS ignored, so both generate exactly the same number of
  tokens. Ratio server / batched (1.0 = server mode costs nothing).
* **short answers do not wait**: half the rows ask for ``response_length / 8`` tokens and half for
  ``response_length``, all sent at once; median completion time of the short requests against that
  of the long ones (batched generation would return every row at the long ones' time: ratio 1.0).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rollout_throughput import THREADS, medium_model_dir, prompt_batch

from verl.builtin import task as builtin
from verl.builtin.warmup import ensure_builtin_model
from verl.config.ppo_trainer import load_config
from verl.utils.model import eos_token_ids, load_tokenizer
from verl.workers.rollout import build_rollout, build_server
from verl.workers.rollout.server_client import ServerRolloutClient, post_json


def measure(name: str, model_path: str, rows: int, length: int, repeats: int) -> tuple[float, float, float]:
    config = load_config(
        [
            f"actor_rollout_ref.model.path={model_path}",
            f"actor_rollout_ref.rollout.name={name}",
            f"actor_rollout_ref.rollout.response_length={length}",
            "actor_rollout_ref.rollout.prompt_length=8",
            "actor_rollout_ref.rollout.ignore_eos=True",
            "actor_rollout_ref.rollout.calculate_log_probs=True",
            "actor_rollout_ref.rollout.load_format=auto",
        ]
    )
    cfg = config.actor_rollout_ref.rollout
    tokenizer = load_tokenizer(model_path)
    rollout = build_rollout(cfg, config.actor_rollout_ref.model, tokenizer, torch.device("cpu"), 0)
    torch.set_num_threads(THREADS)
    prompts = prompt_batch(tokenizer, rows)
    prompts.meta_info.update(do_sample=True, sampling_seed=0)

    def rate(generate) -> float:
        generate(prompts)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = generate(prompts)
            times.append(time.perf_counter() - start)
        return int(out.batch["response_mask"].sum()) / statistics.median(times)

    batched = rate(rollout.generate_sequences)
    server, front = build_server(rollout, cfg, tokenizer, "bench")
    client = ServerRolloutClient(
        [front.address], cfg, tokenizer.pad_token_id, eos_token_ids(tokenizer, model_path)
    )
    served = rate(client.generate_sequences)
    short_over_long = mixed_latency(front.address, prompts, length, cfg.server.timeout_s)
    client.close()
    front.close()
    server.close()
    return batched, served, short_over_long


def mixed_latency(address: str, prompts, length: int, timeout_s: float) -> float:
    """Median completion time of short requests / that of long ones, all sent at once."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    requests = [
        {"prompt_ids": row[m].tolist(), "max_tokens": max(1, length // 8) if i % 2 else length, "seed": i}
        for i, (row, m) in enumerate(zip(ids, mask))
    ]
    start = time.perf_counter()

    def send(request: dict) -> float:
        post_json(f"{address}/generate", request, timeout_s)
        return time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        done = list(pool.map(send, requests))
    return statistics.median(done[1::2]) / statistics.median(done[0::2])


def in_subprocess(name: str, path: str, args: argparse.Namespace) -> list[float]:
    cmd = [sys.executable, __file__, "--one", name, path, "--rows", str(args.rows)]
    cmd += ["--response_length", str(args.response_length), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{name} on {path} failed:\n{out.stderr[-3000:]}")
    return [float(x) for x in out.stdout.strip().splitlines()[-1].split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--response_length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("BACKEND", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(*measure(*args.one, args.rows, args.response_length, args.repeats))
        return
    os.environ.setdefault("VERL_CACHE_DIR", os.path.expanduser("~/.cache/verl"))
    ensure_builtin_model(str(builtin.builtin_model_dir()))
    with tempfile.TemporaryDirectory() as root:
        models = {"0.8M (built-in)": str(builtin.builtin_model_dir()), "28M": medium_model_dir(root)}
        for label, path in models.items():
            for name in ("hf", "vllm"):
                batched, served, ratio = in_subprocess(name, path, args)
                print(
                    f"{label:>16} {name:>4}: batched {batched:8.0f} tok/s   server {served:8.0f} tok/s   "
                    f"server/batched {served / batched:.2f}x   short/long completion time {ratio:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
