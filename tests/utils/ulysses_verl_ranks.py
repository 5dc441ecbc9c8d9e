"""Run under ``torchrun --nproc_per_node 2`` (gloo): verl's Ulysses helpers over a real group of two
ranks. Rank 0 writes what it saw as JSON to ``argv[1]``."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from verl.utils import ulysses


def main(report: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ulysses.set_ulysses_sequence_parallel_group(dist.group.WORLD)
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    positions = torch.arange(5).unsqueeze(0)
    my_ids, my_positions, pad = ulysses.ulysses_pad_and_slice_inputs(ids, positions, sp_size=2)
    share = my_ids.float().unsqueeze(-1).requires_grad_()  # [1, 3, 1]
    gathered = ulysses.gather_outputs_and_unpad(share, gather_dim=1, unpad_dim=1, padding_size=pad)
    gathered.sum().backward()
    heads = torch.arange(12, dtype=torch.float32).view(1, 3, 2, 2) + 100 * rank  # [1, my tokens, heads, D]
    all_tokens = ulysses.gather_seq_scatter_heads(heads, seq_dim=1, head_dim=2)  # [1, 6 tokens, 1 head, D]
    back = ulysses.gather_heads_scatter_seq(all_tokens, head_dim=2, seq_dim=1)
    seen = {
        "rank": rank,
        "ids": my_ids.tolist(),
        "positions": my_positions.tolist(),
        "pad": pad,
        "gathered": gathered.squeeze(-1).tolist(),
        "grad": share.grad.squeeze(-1).tolist(),
        "all_to_all_shape": list(all_tokens.shape),
        "round_trip": bool(torch.equal(back, heads)),
        "world": ulysses.get_ulysses_sequence_parallel_world_size(),
    }
    shares = [None, None]
    dist.all_gather_object(shares, seen)
    if rank == 0:
        with open(report, "w") as f:
            json.dump(shares, f)
    ulysses.set_ulysses_sequence_parallel_group(None)  # a group object alive past destroy aborts the exit
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
