"""The built-in arithmetic task (single-digit additions, `"3+4="` -> `"7"`) to parquet.

    python examples/data_preprocess/arith.py --local_dir ~/data/arith
    python examples/data_preprocess/arith.py --local_dir ~/data/arith2 --low 10 --high 99 --train_size 20000

This is the data the embedded default trains on (`data_source="arith"`, scored by exact match).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from verl.builtin.arith import write_arith_parquet


def main(argv: list[str] | None = None) -> tuple[Path, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--local_dir", default="~/data/arith", help="folder to write train/test.parquet to")
    parser.add_argument("--train_size", type=int, default=10000, help="training prompts")
    parser.add_argument("--test_size", type=int, default=500, help="test prompts")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--low", type=int, default=0, help="smallest operand")
    parser.add_argument("--high", type=int, default=9, help="largest operand")
    args = parser.parse_args(argv)
    paths = write_arith_parquet(
        args.local_dir, args.train_size, args.test_size, args.seed, args.low, args.high
    )
    print(f"wrote {args.train_size} train rows to {paths[0]} and {args.test_size} test rows to {paths[1]}")
    return paths


if __name__ == "__main__":
    main()
