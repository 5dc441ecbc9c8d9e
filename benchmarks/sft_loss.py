"""The SFT trainer's forward+backward with the fused cross-entropy vs torch's, in one process.

    python benchmarks/sft_loss.py [--rows 16 --length 2048 --reps 5] [--packed]

Needs CUDA and Triton (the fused kernel of :mod:`verl.utils.fused_log_probs` runs there only).
Builds the Qwen2.5-0.5B shape, randomly initialised (nothing is downloaded), and a right-padded
micro-batch of ``--rows`` chats of 10..``--length`` tokens with the assistant's tokens (the loss
mask) in the second half of each. Times :func:`verl.trainer.sft_trainer.token_losses` (or
``packed_token_losses``) forward and backward under bf16 autocast, with the kernel and with
torch's cross-entropy on fp32 logits, and prints tokens/s of each, their ratio, peak memory and the
largest loss difference.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from packing import build_model, sync

from verl.trainer.sft_trainer import packed_token_losses, token_losses
from verl.utils import fused_log_probs
from verl.workers.packing import enable_packing


def chats(rows: int, length: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(16, vocab, (rows, length), generator=g)
    lengths = torch.randint(10, length + 1, (rows, 1), generator=g)
    positions = torch.arange(length).expand(rows, length)
    mask = (positions < lengths).long()
    return {
        "input_ids": (ids * mask).cuda(),
        "attention_mask": mask.cuda(),
        "position_ids": (positions * mask).cuda(),
        "loss_mask": (mask * (positions >= lengths // 2)).cuda(),
    }


def time_losses(model, micro, losses_fn, reps: int) -> tuple[float, torch.Tensor]:
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            losses, mask = losses_fn(model, micro)
        (losses * mask).sum().backward()
        model.zero_grad(set_to_none=True)
        return losses.detach()

    losses = step()  # warm-up (and the kernels' compilation)
    times = []
    for _ in range(reps):
        sync("cuda")
        start = time.perf_counter()
        step()
        sync("cuda")
        times.append(time.perf_counter() - start)
    return float(np.median(times)), losses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--packed", action="store_true", help="model.use_remove_padding: packed_token_losses")
    args = p.parse_args()
    probe = torch.empty(0, device="cuda" if torch.cuda.is_available() else "cpu")
    if not fused_log_probs.available(probe):
        raise SystemExit("sft_loss.py: needs CUDA and Triton (the fused kernel runs only there)")

    model = build_model("cuda")
    if args.packed:
        enable_packing(model)
    micro = chats(args.rows, args.length, model.config.vocab_size)
    tokens = int(micro["attention_mask"].sum())
    losses_fn = packed_token_losses if args.packed else token_losses
    results = {}
    for fused in (False, True):
        fused_log_probs.FUSED_LOG_PROBS = fused
        torch.cuda.reset_peak_memory_stats()
        seconds, losses = time_losses(model, micro, losses_fn, args.reps)
        results[fused] = (seconds, losses, torch.cuda.max_memory_allocated() / 2**30)

    fused_losses, torch_losses = results[True][1], results[False][1]
    trained = slice(None) if args.packed else micro["loss_mask"][:, 1 : 1 + torch_losses.shape[1]].bool()
    diff = (fused_losses - torch_losses)[trained].abs().max().item()
    print(
        f"device: {torch.cuda.get_device_name()}; {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params"
    )
    print(f"batch: {args.rows} chats, {tokens} tokens, {'packed' if args.packed else 'padded'}")
    for fused, label in ((False, "torch cross-entropy"), (True, "fused kernel")):
        seconds, _, memory = results[fused]
        print(f"{label:19s} {tokens / seconds:10.0f} tok/s ({seconds:.3f} s, peak {memory:.1f} GiB)")
    print(f"fused / torch throughput {results[False][0] / results[True][0]:.2f}x")
    print(f"max |loss difference| on trained tokens {diff:.2e}")


if __name__ == "__main__":
    main()
