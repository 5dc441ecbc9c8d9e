"""Small-number arithmetic from the `reasoning-gym` package (its `basic_arithmetic` generator) to parquet.

    pip install reasoning-gym
    python examples/data_preprocess/basic_arithmetic.py --local_dir ~/data/basic_arithmetic

No network is needed: expressions of 2-3 single-digit terms joined by ``+``, ``-`` or ``*``
(``"Calculate 5 - 9 * 2."`` -> ``"-13"``) are generated with a seed. SmolLM2-135M-Instruct gets
about 30% of them right greedily, so GRPO has signal from the first step. Rows are scored by the
last number in the response (data_source "reasoning_gym/basic_arithmetic"): a 135M model seldom
keeps a strict answer format.
"""

from __future__ import annotations

from pathlib import Path

from verl.utils.dataset.schema import generated_splits_main, make_row

DATA_SOURCE = "reasoning_gym/basic_arithmetic"
INSTRUCTION = "Give only the final answer."
TASK = {
    "min_terms": 2,
    "max_terms": 3,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ("+", "-", "*"),
    "allow_parentheses": False,
    "allow_negation": False,
}


def generate(size: int, seed: int) -> list[dict]:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError("this script needs the 'reasoning-gym' package: pip install reasoning-gym") from err
    return list(reasoning_gym.create_dataset("basic_arithmetic", size=size, seed=seed, **TASK))


def make_rows(size: int, seed: int, split: str) -> list[dict]:
    rows = []
    for index, item in enumerate(generate(size, seed)):
        prompt = f"{item['question'].strip()} {INSTRUCTION}"
        extra = {"expression": item["metadata"]["expression"]}
        rows.append(
            make_row(DATA_SOURCE, prompt, "math", str(item["answer"]), split, index, extra_info=extra)
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Path]:
    return generated_splits_main(argv, __doc__, "~/data/basic_arithmetic", 128, make_rows)


if __name__ == "__main__":
    main()
