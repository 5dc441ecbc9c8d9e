"""Countdown puzzles (reach a target with + - * / using each given number once), synthetic and seeded.

    python examples/data_preprocess/countdown.py --local_dir ~/data/countdown
    python examples/data_preprocess/countdown.py --local_dir ~/data/countdown4 --num_operands 4 --seed 1

Every puzzle is built from a random expression over its numbers, so it has at least one
solution (kept in extra_info["solution"]). The ground truth is {"target": int, "numbers": [...]};
the model answers with an equation inside <answer></answer>, scored by
verl.utils.reward_score.countdown.
"""

from __future__ import annotations

import argparse
import random
from fractions import Fraction
from pathlib import Path

from verl.utils.dataset.schema import make_row, write_splits

DATA_SOURCE = "countdown"
_APPLY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


def random_expression(rng: random.Random, numbers: list[int]) -> tuple[str, Fraction]:
    """Combine the numbers pairwise in random order with random operations: (text, exact value)."""
    items = [(str(n), Fraction(n)) for n in numbers]
    while len(items) > 1:
        left = items.pop(rng.randrange(len(items)))
        right = items.pop(rng.randrange(len(items)))
        op = rng.choice("+-*/")
        if op == "/" and right[1] == 0:
            op = "+"
        items.append((f"({left[0]} {op} {right[0]})", _APPLY[op](left[1], right[1])))
    text, value = items[0]
    return text[1:-1] if text.startswith("(") else text, value


def make_puzzle(
    rng: random.Random, num_operands: int, max_number: int, max_target: int
) -> tuple[list[int], int, str]:
    """(numbers, target, one solution) with an integer target in [1, max_target]."""
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(num_operands)]
        solution, value = random_expression(rng, numbers)
        if value.denominator == 1 and 1 <= value <= max_target:
            rng.shuffle(numbers)
            return numbers, int(value), solution


def prompt_for(numbers: list[int], target: int) -> str:
    return (
        f"Using the numbers {numbers}, write an equation that equals {target}. Use +, -, * and /, "
        "each number exactly once; brackets are allowed. Think it through, then give only the "
        "equation inside <answer> </answer>, for example <answer>(1 + 2) * 3</answer>."
    )


def make_rows(
    size: int, seed: int, split: str, num_operands: int, max_number: int, max_target: int
) -> list[dict]:
    rng = random.Random(f"countdown:{seed}:{split}")
    rows = []
    for index in range(size):
        numbers, target, solution = make_puzzle(rng, num_operands, max_number, max_target)
        truth = {"target": target, "numbers": numbers}
        rows.append(
            make_row(
                DATA_SOURCE,
                prompt_for(numbers, target),
                "math",
                truth,
                split,
                index,
                extra_info={"solution": solution},
            )
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--local_dir", default="~/data/countdown", help="folder to write train/test.parquet to"
    )
    parser.add_argument("--train_size", type=int, default=10000, help="training puzzles")
    parser.add_argument("--test_size", type=int, default=500, help="test puzzles")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--num_operands", type=int, default=3, help="numbers per puzzle")
    parser.add_argument("--max_number", type=int, default=99, help="largest number drawn")
    parser.add_argument("--max_target", type=int, default=1000, help="largest target")
    args = parser.parse_args(argv)
    shape = (args.num_operands, args.max_number, args.max_target)
    rows = {
        "train": make_rows(args.train_size, args.seed, "train", *shape),
        "test": make_rows(args.test_size, args.seed, "test", *shape),
    }
    paths = write_splits(rows, args.local_dir)
    for split, path in paths.items():
        print(f"wrote {len(rows[split])} {split} rows to {path}")
    return paths


if __name__ == "__main__":
    main()
