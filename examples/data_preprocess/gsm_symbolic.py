"""Offline GSM8K-style problems from the `reasoning-gym` package (its `gsm_symbolic` generator).

    pip install reasoning-gym
    python examples/data_preprocess/gsm_symbolic.py --local_dir ~/data/gsm_symbolic

No network is needed: problems are generated from templates with a seed. Prompts ask for the
final answer after "####" like GSM8K, and rows are scored by the GSM8K scorer
(data_source "reasoning_gym/gsm_symbolic").
"""

from __future__ import annotations

from pathlib import Path

from verl.utils.dataset.schema import generated_splits_main, make_row

DATA_SOURCE = "reasoning_gym/gsm_symbolic"
INSTRUCTION = 'Think step by step, then give the final answer as a number after "####".'


def generate(size: int, seed: int) -> list[dict]:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError("this script needs the 'reasoning-gym' package: pip install reasoning-gym") from err
    return list(reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed))


def make_rows(size: int, seed: int, split: str) -> list[dict]:
    rows = []
    for index, item in enumerate(generate(size, seed)):
        extra = {"question": item["question"], "source_index": item["metadata"].get("source_index")}
        prompt = f"{item['question']} {INSTRUCTION}"
        rows.append(
            make_row(DATA_SOURCE, prompt, "math", str(item["answer"]).strip(), split, index, extra_info=extra)
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Path]:
    return generated_splits_main(argv, __doc__, "~/data/gsm_symbolic", 500, make_rows)


if __name__ == "__main__":
    main()
