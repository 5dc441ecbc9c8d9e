"""``python -m verl.model_merger merge --backend fsdp --local_dir <.../global_step_N/actor> --target_dir <dir>``."""

from __future__ import annotations

import argparse

from verl.model_merger.fsdp import merge_fsdp_checkpoint


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="write a Hugging Face model directory from a checkpoint")
    merge.add_argument("--backend", default="fsdp", help="fsdp (megatron is not supported here)")
    merge.add_argument(
        "--local_dir",
        required=True,
        help="the actor (RL) or model (SFT) folder of a global_step_N checkpoint",
    )
    merge.add_argument("--target_dir", required=True, help="where to write the Hugging Face model")
    merge.add_argument("--dtype", default="float32", help="weights dtype: float32 (default) or bfloat16")
    args = parser.parse_args(argv)
    if args.backend != "fsdp":
        parser.error(f"--backend {args.backend} is not supported; use --backend fsdp")
    print(f"wrote {merge_fsdp_checkpoint(args.local_dir, args.target_dir, args.dtype)}")


if __name__ == "__main__":
    main()
