"""Reward-manager throughput: rows scored per second for GSM8K and MATH responses.

    python benchmarks/reward_throughput.py                    # 10,000 rows, 1 and 2 scorer processes
    python benchmarks/reward_throughput.py --rows 2000 --workers 0 1 2

Builds a batch of synthetic responses (half correct; MATH answers mix exact matches, equivalent
forms such as 0.75 for \\frac{3}{4}, and wrong answers), tokenises them with an in-memory
character tokenizer, and times ``NaiveRewardManager(batch)``: decoding, scoring in the pool and
placing the scores. ``--workers 0`` scores in the driver process, for reference. This is a
benchmark, not a test; it prints a table.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.reward_score.scorer_process import ScorerSpec
from verl.workers.reward_manager import NaiveRewardManager

PROMPT_LEN, RESPONSE_LEN = 8, 160


def char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1}
    for ch in [chr(i) for i in range(32, 127)] + ["\n"]:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>")


def gsm8k_rows(n: int, rng: random.Random) -> tuple[list[str], list[str]]:
    responses, truths = [], []
    for _ in range(n):
        a, b = rng.randint(1, 999), rng.randint(1, 999)
        answer = a + b if rng.random() < 0.5 else a + b + 1
        responses.append(
            f"First {a} items, then {b} more, so {a} + {b} = {answer} in total.\n#### {answer:,}"
        )
        truths.append(str(a + b))
    return responses, truths


def math_rows(n: int, rng: random.Random) -> tuple[list[str], list[str]]:
    forms = [
        ("\\frac{3}{4}", "\\frac{3}{4}"),
        ("0.75", "\\frac{3}{4}"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("5", "6"),
    ]
    responses, truths = [], []
    for _ in range(n):
        given, truth = rng.choice(forms)
        responses.append(f"Simplify step by step; the result is $\\boxed{{{given}}}$.")
        truths.append(truth)
    return responses, truths


def make_batch(tokenizer, source: str, responses: list[str], truths: list[str]) -> DataProto:
    n = len(responses)
    ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
    resp = torch.zeros(n, RESPONSE_LEN, dtype=torch.long)
    mask = torch.zeros(n, PROMPT_LEN + RESPONSE_LEN, dtype=torch.long)
    mask[:, :PROMPT_LEN] = 1
    for i, row in enumerate(ids):
        row = [*row, tokenizer.eos_token_id][:RESPONSE_LEN]
        resp[i, : len(row)] = torch.tensor(row)
        mask[i, PROMPT_LEN : PROMPT_LEN + len(row)] = 1
    tensors = {"prompts": torch.full((n, PROMPT_LEN), 2), "responses": resp, "attention_mask": mask}
    non_tensors = {
        "data_source": np.array([source] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
    }
    return DataProto.from_dict(tensors, non_tensors)


def measure(tokenizer, data: DataProto, workers: int) -> tuple[float, dict]:
    """Seconds to score ``data`` once the scorer processes are up, and the manager's output."""
    manager = NaiveRewardManager(tokenizer, compute_score=ScorerSpec(), num_workers=workers, timeout_s=30)
    try:
        manager.pool.wait_ready()
        start = time.perf_counter()
        out = manager(data, return_dict=True)
        elapsed = time.perf_counter() - start
    finally:
        manager.close()
    return elapsed, out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10000, help="responses per data source")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="scorer process counts to try")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tokenizer = char_tokenizer()
    rng = random.Random(args.seed)
    batches = {
        "openai/gsm8k": make_batch(tokenizer, "openai/gsm8k", *gsm8k_rows(args.rows, rng)),
        "lighteval/MATH": make_batch(tokenizer, "lighteval/MATH", *math_rows(args.rows, rng)),
    }
    print(
        f"{'data_source':<16} {'workers':>7} {'rows':>7} {'seconds':>8} {'rows/s':>9} {'mean score':>10} {'errors':>6}"
    )
    for source, data in batches.items():
        for workers in args.workers:
            elapsed, out = measure(tokenizer, data, workers)
            scores = out["reward_extra_info"]["score"]
            errors = out["reward_metrics"]["reward/errors"] + out["reward_metrics"]["reward/timeouts"]
            print(
                f"{source:<16} {workers:>7} {len(data):>7} {elapsed:>8.2f} {len(data) / elapsed:>9.0f} "
                f"{sum(scores) / len(scores):>10.3f} {errors:>6}"
            )


if __name__ == "__main__":
    main()
