"""Write a Hugging Face causal LM as a megatron-core distributed checkpoint, once, for
``megatron.use_dist_checkpointing=True`` / ``megatron.dist_checkpointing_path=<output_path>``.

verl's ``scripts/converter_hf_to_mcore.py`` arguments; the conversion is this project's own
(:func:`verl.workers.engine.megatron.dist_checkpoint.convert_hf_to_dist_checkpoint`), written into
``<output_path>.partial`` and renamed into place when every rank is done. The checkpoint loads at any
tensor / pipeline layout, so the split used here only decides which ranks hold which slices while
converting (one process holds the whole model).

One GPU (or one process)::

    python scripts/converter_hf_to_mcore.py --hf_model_path Qwen/Qwen2.5-0.5B --output_path ckpt/qwen-mcore

Several GPUs or nodes (``--tp_size`` x ``--pp_size`` must divide the ranks; ``--ep_size`` splits a MoE
model's experts)::

    torchrun --nproc_per_node 8 scripts/converter_hf_to_mcore.py --hf_model_path <dir> \\
        --output_path <dir> --pp_size 4 --tp_size 2

megatron-core needs a CUDA GPU: on a machine without one this stops with a message saying so (the
project's CPU tests run it behind their own shim, tests/megatron/cpu_shim.py).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hf_model_path", required=True, help="the Hugging Face model folder (or hub name)")
    parser.add_argument(
        "--output_path", required=True, help="the distributed checkpoint's folder (must not exist)"
    )
    parser.add_argument("--pp_size", type=int, default=1, help="pipeline model parallel size")
    parser.add_argument("--ep_size", type=int, default=1, help="expert model parallel size")
    parser.add_argument(
        "--tp_size", type=int, default=1, help="tensor model parallel size (not in verl's script)"
    )
    parser.add_argument(
        "--use_cpu_initialization", action="store_true", help="initialise megatron-core's weights on the CPU"
    )
    parser.add_argument(
        "--test", action="store_true", help="load the written checkpoint back and check every weight"
    )
    parser.add_argument("--trust_remote_code", action="store_true", help="trust the model's own code")
    return parser.parse_args(argv)


def _init_process_group(device: torch.device) -> bool:
    """torchrun's process group, or one of one rank; False when the caller had one already."""
    if dist.is_initialized():
        return False
    if "WORLD_SIZE" in os.environ:
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return True
    from verl.workers.engine.megatron.groups import ensure_process_group

    ensure_process_group(device)
    return True


def check_round_trip(model: torch.nn.Module, args: argparse.Namespace) -> None:
    """``--test``: a freshly built stage loaded from the checkpoint equals the converted one."""
    from transformers import AutoConfig

    from verl.workers.engine.megatron.dist_checkpoint import build_stage, load_dist_checkpoint

    hf_config = AutoConfig.from_pretrained(args.hf_model_path, trust_remote_code=args.trust_remote_code)
    dtype = next(model.parameters()).dtype
    fresh = build_stage(hf_config, args.tp_size, args.pp_size, dtype).to(next(model.parameters()).device)
    load_dist_checkpoint(fresh, args.output_path, "--output_path")
    loaded = dict(fresh.named_parameters())
    for name, param in model.named_parameters():
        if not torch.equal(param, loaded[name]):
            raise AssertionError(f"{args.output_path}: {name} differs after loading it back")
    print(f"rank {dist.get_rank()}: {len(loaded)} tensors read back equal")


def main(argv: list[str] | None = None) -> None:
    from verl.workers.engine.megatron.dist_checkpoint import convert_hf_to_dist_checkpoint

    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    owned = _init_process_group(device)
    try:
        model = convert_hf_to_dist_checkpoint(
            args.hf_model_path,
            args.output_path,
            tp=args.tp_size,
            pp=args.pp_size,
            ep=args.ep_size,
            device=device,
            use_cpu_initialization=args.use_cpu_initialization,
            trust_remote_code=args.trust_remote_code,
        )
        if args.test:
            check_round_trip(model, args)
        if dist.get_rank() == 0:
            print(f"wrote {args.output_path}")
    finally:
        if owned:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
