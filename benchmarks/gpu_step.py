"""One PPO step of the policy worker on one CUDA GPU, phase by phase, against plain transformers.

    python benchmarks/gpu_step.py [--layers 24 --hidden 896 --prompts 64 --n 4 --response-length 256]
                                  [--remove-padding] [--override key=value ...] [--profile]
                                  [--no-generate] [--engine fsdp2|plain] [--log-probs fused|eager]

Builds a randomly initialised Qwen2 model (default: the Qwen2.5-0.5B shape, ~0.49B parameters;
nothing is downloaded), runs the real ``ActorRolloutRefWorker`` in this process (FSDP2 with
bf16 compute for the actor, bf16 ``hf`` rollout with a KV cache) and times generate,
log-prob and update. Baselines in the same process: ``model.generate`` of transformers
(same model, dtype, batch and length) and a plain bf16 forward/backward/AdamW step on the
same tokens. Prints tokens/s of each, the ratios, MFU and peak memory (of the whole step, of the
update, and what stays allocated between steps: ``fsdp_config.param_offload`` and
``optimizer_offload`` show there). ``--no-generate`` draws random full-length responses instead of
generating (the update's cost does not depend on what was sampled); ``--engine plain`` runs a
single GPU without FSDP2 (fp32 weights under CUDA autocast); ``--log-probs eager`` computes log-probs
and entropy with torch ops a few rows at a time instead of the fused Triton kernels
(:mod:`verl.utils.fused_log_probs`). Needs CUDA.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time

import numpy as np
import torch

from verl.algorithms.advantages import compute_advantage_for
from verl.builtin.task import build_char_tokenizer
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.workers.rollout.base import response_tensors

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def build_model_dir(args: argparse.Namespace) -> str:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    path = tempfile.mkdtemp(prefix="verl-gpu-bench-")
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def start_worker(path: str, args: argparse.Namespace, device: str = "cuda"):
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    os.environ.update(MASTER_PORT=str(port), VERL_DEVICE=device)
    rows = args.prompts * args.n
    length = args.prompt_length + args.response_length
    config = load_config(
        [
            f"actor_rollout_ref.model.path={path}",
            f"data.max_prompt_length={args.prompt_length}",
            f"data.max_response_length={args.response_length}",
            f"data.train_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro * 2}",
            f"actor_rollout_ref.rollout.n={args.n}",
            f"actor_rollout_ref.rollout.max_num_seqs={rows}",
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.actor.optim.total_training_steps=100",
            *(
                [
                    "actor_rollout_ref.model.use_remove_padding=True",
                    "actor_rollout_ref.actor.use_dynamic_bsz=True",
                    f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={args.micro * length}",
                    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
                    f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={args.micro * 2 * length}",
                ]
                if args.remove_padding
                else []
            ),
            *args.override,
        ]
    )
    worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    return worker, config


def prompt_batch(args: argparse.Namespace, pad: int) -> DataProto:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(16, args.vocab, (args.prompts, args.prompt_length), generator=g)
    mask = torch.ones_like(ids)
    uid = np.array([str(i) for i in range(args.prompts)], dtype=object)
    data = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
        non_tensors={"uid": uid},
    )
    return data.repeat(args.n, interleave=True)


def timed(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - start


def random_responses(prompts: DataProto, args: argparse.Namespace) -> DataProto:
    """Full-length random responses in the rollout's layout (no EOS in them)."""
    p = prompts.batch
    g = torch.Generator().manual_seed(3)
    responses = torch.randint(16, args.vocab, (len(prompts), args.response_length), generator=g)
    tensors = response_tensors(
        p["input_ids"], p["attention_mask"], p["position_ids"], responses, torch.zeros_like(responses), [-1]
    )
    return DataProto.from_dict(tensors)


def framework_step(worker, config, args) -> dict[str, float]:
    batch = prompt_batch(args, worker.tokenizer.pad_token_id)
    prompts = batch.pop(batch_keys=["input_ids", "attention_mask", "position_ids"])
    prompts.meta_info.update(global_steps=1, do_sample=True)
    if args.no_generate:
        gen, t_gen = random_responses(prompts, args), float("nan")
    else:
        gen, t_gen = timed(lambda: worker.generate_sequences(prompts))
    batch.union(gen)
    lp, t_lp = timed(lambda: worker.compute_log_prob(batch))
    batch.union(lp.select(batch_keys=["old_log_probs"]))
    mask = batch.batch["response_mask"]
    rewards = torch.zeros(mask.shape)
    rewards[:, -1] = torch.rand(len(rewards), generator=torch.Generator().manual_seed(2))
    batch.batch["token_level_rewards"] = rewards
    algo = config.algorithm
    compute_advantage_for(batch, algo)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            worker.update_actor(batch)
        print(
            prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60)
        )
    torch.cuda.reset_peak_memory_stats()
    _, t_upd = timed(lambda: worker.update_actor(batch))
    return {
        "gen_s": t_gen,
        "log_prob_s": t_lp,
        "update_s": t_upd,
        "update_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "resident_gib": torch.cuda.memory_allocated() / 2**30,
        "response_tokens": float(mask.sum()),
        "all_tokens": float(batch.batch["attention_mask"].sum()),
    }


def baseline_generate(model, args, pad: int, eos: int) -> float:
    batch = prompt_batch(args, pad)
    ids = batch.batch["input_ids"].cuda()
    kwargs = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.response_length)
    _, seconds = timed(
        lambda: model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), pad_token_id=pad, eos_token_id=eos, **kwargs
        )
    )
    return seconds


def baseline_update(model, args) -> float:
    """A bf16-autocast forward/backward/AdamW pass over the same number of sequences."""
    optim = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rows, length = args.prompts * args.n, args.prompt_length + args.response_length
    ids = torch.randint(16, args.vocab, (rows, length), device="cuda")

    def run():
        for start in range(0, rows, args.micro):
            chunk = ids[start : start + args.micro]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=chunk).logits
            loss = torch.log_softmax(logits.float(), -1).gather(-1, chunk[..., None]).mean()
            (loss * args.micro / rows).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)

    run()  # warm-up (allocates optimizer state)
    return timed(run)[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--override", action="append", default=[], help="a config key=value (repeatable)")
    p.add_argument("--profile", action="store_true", help="print a torch profile of one actor update")
    p.add_argument("--no-generate", action="store_true", help="random responses instead of generating")
    p.add_argument(
        "--engine",
        choices=["fsdp2", "plain"],
        default=None,
        help="one GPU under FSDP2 or as a plain module under autocast (default: the engine's choice)",
    )
    p.add_argument(
        "--log-probs",
        choices=["fused", "eager"],
        default="fused",
        help="log-probs and entropy by the fused Triton kernels or by torch ops (default: fused)",
    )
    p.add_argument(
        "--remove-padding",
        action="store_true",
        help="packed sequences (use_remove_padding) with token budgets of --micro full-length rows",
    )
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu_step.py needs a CUDA GPU")

    if args.engine is not None:
        from verl.workers.engine import fsdp

        fsdp.SHARD_ONE_GPU = args.engine == "fsdp2"
    from verl.utils import fused_log_probs

    fused_log_probs.FUSED_LOG_PROBS = args.log_probs == "fused"
    path = build_model_dir(args)
    worker, config = start_worker(path, args)
    n_params = sum(p.numel() for p in worker.actor.module.parameters())
    framework_step(worker, config, args)  # warm-up
    runs = [framework_step(worker, config, args) for _ in range(args.steps)]
    fw = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    sharded = worker.actor.sharded
    del worker
    torch.cuda.empty_cache()

    from transformers import AutoModelForCausalLM

    if not args.no_generate:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
        tok = build_char_tokenizer()
        # random weights rarely emit EOS, so both sides generate the full length
        base_gen = baseline_generate(model, args, tok.pad_token_id, tok.eos_token_id)
        base_gen = min(base_gen, baseline_generate(model, args, tok.pad_token_id, tok.eos_token_id))
        del model
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().train()
    base_upd = baseline_update(model, args)

    gpu = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    rows = args.prompts * args.n
    train_flops = 6 * n_params * fw["all_tokens"]
    base_mem = torch.cuda.max_memory_allocated() / 2**30
    print(f"device: {gpu}; model: {n_params / 1e6:.0f}M params; {rows} sequences; engine: ", end="")
    print(("FSDP2" if sharded else "plain module under autocast") + f"; log-probs: {args.log_probs}")
    print(f"  prompt {args.prompt_length} + response {args.response_length} tokens")
    if not args.no_generate:
        print(
            f"generate     framework {fw['response_tokens'] / fw['gen_s']:9.0f} tok/s ({fw['gen_s']:.2f} s)"
        )
        base_tokens = rows * args.response_length
        print(f"             hf.generate {base_tokens / base_gen:7.0f} tok/s ({base_gen:.2f} s)")
        print(
            f"             ratio (framework time / baseline time, same tokens) {fw['gen_s'] / base_gen:.2f}"
        )
    print(
        f"log_prob     framework {fw['all_tokens'] / fw['log_prob_s']:9.0f} tok/s ({fw['log_prob_s']:.2f} s)"
    )
    print(f"update_actor framework {fw['all_tokens'] / fw['update_s']:9.0f} tok/s ({fw['update_s']:.2f} s)")
    print(
        f"             plain torch {rows * (args.prompt_length + args.response_length) / base_upd:7.0f} tok/s"
    )
    print(f"             ratio (framework time / baseline time) {fw['update_s'] / base_upd:.2f}")
    if peak:
        print(f"update MFU {train_flops / fw['update_s'] / (peak * 1e12):.3f} (peak bf16 {peak:.0f} TFLOP/s)")
    print(f"peak memory: update {fw['update_peak_gib']:.1f} GiB (plain loop {base_mem:.1f} GiB)", end="")
    print(f"; allocated between steps {fw['resident_gib']:.2f} GiB")


if __name__ == "__main__":
    main()
