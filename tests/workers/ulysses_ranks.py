"""Run under ``torchrun --nproc_per_node N`` (gloo): the packed forward and backward of a tiny
Qwen2 with its sequences split over the N ranks (Ulysses), against the same model on one rank.
Rank 0 writes the largest differences as JSON to ``argv[1]``."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.workers import ulysses
from verl.workers.forward import EntropyOptions, response_log_probs
from verl.workers.packing import enable_packing


def model(kv_heads: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return enable_packing(Qwen2ForCausalLM(config).float())


def batch() -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of mixed lengths (one a single token)."""
    gen = torch.Generator().manual_seed(1)
    prompt, response, rows = 9, 7, 5
    ids = torch.randint(3, 50, (rows, prompt + response), generator=gen)
    prompt_lengths, response_lengths = [9, 3, 1, 6, 4], [7, 2, 5, 1, 7]
    mask = torch.zeros(rows, prompt + response, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        mask[i, prompt - p : prompt + r] = 1
    ids = ids * mask
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt:],
        "response_mask": mask[:, prompt:],
    }


def run(module, micro, group) -> tuple[dict, dict]:
    with ulysses.sequence_parallel(group):
        out = response_log_probs(module, micro, 0.7, EntropyOptions(), packed=True)
    loss = (out["log_probs"] * micro["response_mask"]).sum() + out["entropys"].mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    if group is not None:  # the group's gradient is the sum of its ranks' (FSDP then averages groups)
        for g in grads.values():
            dist.all_reduce(g, group=group)
    return {k: v.detach() for k, v in out.items()}, grads


def main() -> None:
    dist.init_process_group("gloo")
    group = ulysses.build_groups(dist.get_world_size(), "ulysses_sequence_parallel_size")
    micro = batch()
    report = {}
    for kv_heads in (2, 1):
        split_out, split_grads = run(model(kv_heads), micro, group)
        whole_out, whole_grads = run(model(kv_heads), micro, None)
        mask = micro["response_mask"].bool()
        report[f"kv{kv_heads}"] = {
            "log_probs": float((split_out["log_probs"] - whole_out["log_probs"])[mask].abs().max()),
            "entropys": float((split_out["entropys"] - whole_out["entropys"])[mask].abs().max()),
            "grads": max(float((split_grads[n] - whole_grads[n]).abs().max()) for n in whole_grads),
            "grad_scale": max(float(g.abs().max()) for g in whole_grads.values()),
        }
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
