"""``python -m verl.model_merger merge --backend fsdp|megatron --local_dir <.../global_step_N/actor> --target_dir <dir>``.

``--backend`` is the engine that wrote the checkpoint: ``fsdp`` (DCP shards, ``*.distcp``) or
``megatron`` (``megatron_rank_*.pt``, one file per rank); both run on one CPU process."""

from __future__ import annotations

import argparse

from verl.model_merger.fsdp import merge_fsdp_checkpoint
from verl.model_merger.megatron import merge_megatron_checkpoint

MERGERS = {"fsdp": merge_fsdp_checkpoint, "megatron": merge_megatron_checkpoint}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m verl.model_merger", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="write a Hugging Face model directory from a checkpoint")
    merge.add_argument(
        "--backend",
        default="fsdp",
        choices=sorted(MERGERS),
        help="the engine that wrote the checkpoint: fsdp (*.distcp shards, default) or megatron "
        "(megatron_rank_*.pt files)",
    )
    merge.add_argument(
        "--local_dir",
        required=True,
        help="the actor (RL) or model (SFT) folder of a global_step_N checkpoint",
    )
    merge.add_argument("--target_dir", required=True, help="where to write the Hugging Face model")
    merge.add_argument("--dtype", default="float32", help="weights dtype: float32 (default) or bfloat16")
    args = parser.parse_args(argv)
    print(f"wrote {MERGERS[args.backend](args.local_dir, args.target_dir, args.dtype)}")


if __name__ == "__main__":
    main()
