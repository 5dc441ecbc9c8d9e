"""Packed vs padded forward+backward of the policy's log-prob function on mixed-length sequences.

    python benchmarks/packing.py [--device cpu|cuda] [--rows 16 --prompt 256 --response 256]

Builds a randomly initialised Qwen2 model (small on CPU, the Qwen2.5-0.5B shape on CUDA; nothing is
downloaded) and a micro-batch whose prompt and response lengths are drawn uniformly from
``10..--prompt`` and ``10..--response`` (left- and right-padded as the trainer lays them out). Times
:func:`verl.workers.forward.response_log_probs` with and without ``packed`` in the same process
(fp32 on CPU, bf16 autocast on CUDA) and prints real tokens/s of each, the ratio, the largest
log-prob difference between the two and, on CUDA, peak memory.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from verl.workers.forward import EntropyOptions, response_log_probs
from verl.workers.packing import enable_packing

SHAPES = {  # layers, hidden, intermediate, heads, kv heads, vocab
    "cpu": (4, 256, 1024, 4, 2, 32000),
    "cuda": (24, 896, 4864, 14, 2, 151936),
}


def build_model(device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layers, hidden, inter, heads, kv, vocab = SHAPES[device]
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device).train()


def mixed_batch(rows: int, prompt: int, response: int, vocab: int, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(16, vocab, (rows, prompt + response), generator=g)
    mask = torch.zeros_like(ids)
    for row in range(rows):
        p = int(torch.randint(10, prompt + 1, (1,), generator=g))
        r = int(torch.randint(10, response + 1, (1,), generator=g))
        mask[row, prompt - p : prompt + r] = 1
    micro = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt:],
    }
    return {k: v.to(device) for k, v in micro.items()}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_step(model, micro, packed: bool, device: str, reps: int) -> tuple[float, torch.Tensor]:
    real = micro["attention_mask"][:, -micro["responses"].shape[1] :].bool()

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            out = response_log_probs(model, micro, 1.0, EntropyOptions(), packed=packed)
        (out["log_probs"] * real).sum().backward()
        model.zero_grad(set_to_none=True)
        return out["log_probs"].detach()

    log_probs = step()  # warm-up
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    return float(np.median(times)), log_probs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    p.add_argument("--rows", type=int, default=16, help="sequences in the micro-batch")
    p.add_argument("--prompt", type=int, default=None, help="longest prompt (256 CPU, 512 CUDA)")
    p.add_argument("--response", type=int, default=None, help="longest response (256 CPU, 512 CUDA)")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    cuda = args.device == "cuda"
    rows = args.rows
    prompt = args.prompt or (512 if cuda else 256)
    response = args.response or (512 if cuda else 256)

    model = build_model(args.device)
    micro = mixed_batch(rows, prompt, response, model.config.vocab_size, args.device)
    tokens = int(micro["attention_mask"].sum())
    padded_tokens = micro["attention_mask"].numel()
    results = {}
    for packed in (False, True):
        if packed:
            enable_packing(model)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        seconds, log_probs = time_step(model, micro, packed, args.device, args.reps)
        memory = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        results[packed] = (seconds, log_probs, memory)

    real = micro["attention_mask"][:, -response:].bool()
    diff = (results[True][1] - results[False][1])[real].abs().max().item()
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"device: {name}; {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params")
    print(
        f"batch: {rows} sequences, {tokens} real tokens of {padded_tokens} padded ({tokens / padded_tokens:.2f})"
    )
    for packed, label in ((False, "padded"), (True, "packed")):
        seconds, _, memory = results[packed]
        mem = f", peak {memory:.1f} GiB" if memory is not None else ""
        print(f"{label:7s} forward+backward {tokens / seconds:10.0f} real tok/s ({seconds:.3f} s{mem})")
    print(f"packed / padded throughput {results[False][0] / results[True][0]:.2f}x")
    print(f"max |log-prob difference| on real response tokens {diff:.2e}")


if __name__ == "__main__":
    main()
