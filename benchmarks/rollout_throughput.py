"""Generation throughput of the ``vllm`` rollout against the ``hf`` rollout, same prompts.

    .venv/bin/python benchmarks/rollout_throughput.py [--rows 256] [--response_length 64] [--repeats 3]

Two models: the built-in 0.8M-parameter Qwen2 and a ~28M-parameter Qwen2 of the same
character vocabulary (random weights, 8 layers of width 512, head size 64). Both backends
get the same left-padded prompts (the arithmetic task, each row repeated as GRPO does), sample
at temperature 1 with EOS ignored so every row generates exactly ``response_length`` tokens,
and return the log-probs of the sampled tokens (``calculate_log_probs=True``, what training
needs). fp32, 2 torch threads, one process. Prints tokens/s of each backend (median of
``repeats`` timed calls after one warm-up call) and the ratio vllm / hf (aim >= 5 on the 28M model).

The embedded default's step time with each engine is measured by running it:
``python -m verl.trainer.main_ppo actor_rollout_ref.rollout.name={hf,vllm}`` (``timing_s/step``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from verl.builtin import task as builtin
from verl.builtin.warmup import ensure_builtin_model
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.utils.model import load_tokenizer
from verl.workers.rollout import build_rollout

THREADS = 2


def medium_model_dir(root: str) -> str:
    """A ~28M-parameter Qwen2 with the built-in tokenizer, saved under ``root``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = builtin.build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(builtin.CHAR_VOCAB),
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    path = os.path.join(root, "qwen2-28m")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def prompt_batch(tokenizer, rows: int) -> DataProto:
    from verl.builtin.arith import make_arith_rows

    texts = [r["prompt"][0]["content"] for r in make_arith_rows(num_rows=rows, seed=0, split="bench")]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(r) for r in ids)
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in ids])
    mask = (input_ids != tokenizer.pad_token_id).long()
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    )


def tokens_per_second(name: str, model_path: str, rows: int, length: int, repeats: int) -> float:
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
    model_cfg = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model_path)
    rollout = build_rollout(config.actor_rollout_ref.rollout, model_cfg, tokenizer, torch.device("cpu"), 0)
    torch.set_num_threads(THREADS)
    prompts = prompt_batch(tokenizer, rows)
    prompts.meta_info.update(do_sample=True, sampling_seed=0)
    rollout.generate_sequences(prompts)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = rollout.generate_sequences(prompts)
        times.append(time.perf_counter() - start)
    generated = int(out.batch["response_mask"].sum())
    return generated / statistics.median(times)


def measure_in_subprocess(name: str, path: str, args: argparse.Namespace) -> float:
    """One backend on one model in a fresh process (an in-process vLLM engine sets up global
    distributed state that a second engine in the same process would trip over)."""
    cmd = [sys.executable, __file__, "--one", name, path, "--rows", str(args.rows)]
    cmd += ["--response_length", str(args.response_length), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{name} on {path} failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--response_length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", nargs=2, metavar=("BACKEND", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(tokens_per_second(*args.one, args.rows, args.response_length, args.repeats))
        return
    os.environ.setdefault("VERL_CACHE_DIR", os.path.expanduser("~/.cache/verl"))
    ensure_builtin_model(str(builtin.builtin_model_dir()))
    with tempfile.TemporaryDirectory() as root:
        models = {"0.8M (built-in)": str(builtin.builtin_model_dir()), "28M": medium_model_dir(root)}
        for label, path in models.items():
            rates = {name: measure_in_subprocess(name, path, args) for name in ("hf", "vllm")}
            print(
                f"{label:>16}: hf {rates['hf']:8.0f} tok/s   vllm {rates['vllm']:8.0f} tok/s   "
                f"vllm/hf {rates['vllm'] / rates['hf']:.2f}x   ({args.rows} rows x {args.response_length} tokens)",
                flush=True,
            )


if __name__ == "__main__":
    main()
