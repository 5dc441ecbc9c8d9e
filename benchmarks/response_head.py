"""The padded log-prob forward with the LM head on the response's positions only, against the head on
every position (what it did before), forward and backward.

    python benchmarks/response_head.py [--rows 8 --prompt 107 --response 64 --repeats 3]

A randomly initialised model of SmolLM2-135M's shape (30 layers, hidden 576, vocabulary 49152; nothing
is downloaded) on a batch laid out as the trainer does (prompts left-padded to ``--prompt``, responses
of ``--response`` tokens), fp32 on the CPU. Prints the median seconds of each way, the ratio, the
largest log-prob difference between them (0 expected: the same rows of the same matmul) and the size
of the fp32 logits each keeps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verl.workers import forward
from verl.workers.forward import EntropyOptions, response_log_probs


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def build_batch(rows: int, prompt: int, response: int, vocab: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(rows):  # left pads of varied width, as the trainer's prompts have
        mask[row, : int(torch.randint(0, prompt // 2, (1,), generator=generator))] = 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt:],
    }


def time_step(model, batch, repeats: int) -> tuple[float, torch.Tensor]:
    times, log_probs = [], None
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        out = response_log_probs(model, batch, temperature=1.0, entropy=EntropyOptions())
        (out["log_probs"].sum() + out["entropys"].sum()).backward()
        times.append(time.perf_counter() - start)
        log_probs = out["log_probs"].detach()
    return statistics.median(times), log_probs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=107)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = build_model()
    batch = build_batch(args.rows, args.prompt, args.response, model.config.vocab_size)
    kept = forward.takes_logits_to_keep
    try:
        forward.takes_logits_to_keep = lambda module: False
        every, every_lp = time_step(model, batch, args.repeats)
    finally:
        forward.takes_logits_to_keep = kept
    responses, response_lp = time_step(model, batch, args.repeats)
    vocab_mb = 4 * model.config.vocab_size / 2**20
    print(
        f"head on every position: {every:.2f} s (fp32 logits {args.rows * (args.prompt + args.response) * vocab_mb:.0f} MB)"
    )
    print(
        f"head on response positions: {responses:.2f} s (fp32 logits {args.rows * (args.response + 1) * vocab_mb:.0f} MB)"
    )
    print(f"ratio (response / every): {responses / every:.3f}")
    print(f"largest log-prob difference: {float((response_lp - every_lp).abs().max()):.2e}")


if __name__ == "__main__":
    main()
