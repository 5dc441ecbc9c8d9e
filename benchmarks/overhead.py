"""Framework step time vs a minimal single-process torch loop doing the same work.

    .venv/bin/python benchmarks/overhead.py [--steps 30] [--warmup 5]

Both sides use the embedded default's model, data and shapes (GRPO, 32 prompts x 8
samples, prompts padded to 8 tokens, responses up to 4, lr 3e-4, 2 torch threads):
generate with a KV cache, score, one log-prob forward for the old policy, one
forward/backward/AdamW update. The framework runs it through Ray (one worker process
holding actor + rollout, driver-side reward and advantages, weight sync); the baseline is
a plain loop in this process. Prints the median step time of each and the ratio
(aim <= 1.10). The framework runs twice: as shipped (the update is on-policy, so it skips the
old-log-prob forward and takes those log-probs from its own forward), and with
``trainer.skip_on_policy_old_log_prob=False``, which does the same work as the minimal loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache

from verl.builtin.assets import prepare_ppo_assets
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo import builders
from verl.utils.model import load_tokenizer

THREADS = 2


def framework_step_times(steps: int, warmup: int, *overrides: str) -> list[float]:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = load_config(
        [
            "trainer.logger=[console]",
            "trainer.val_before_train=False",
            f"trainer.cpus_per_worker={THREADS}",
            *overrides,
        ]
    )
    prepare_ppo_assets(config)
    builders.init_ray(config)
    trainer = RayPPOTrainer(config)
    trainer.init_workers()
    trainer.batches = trainer._batches()
    times = []
    try:
        for _ in range(warmup + steps):
            start = time.perf_counter()
            trainer.global_steps += 1
            metrics = trainer.train_step(next(trainer.batches))
            trainer.tracker.log(
                {k: v for k, v in metrics.items() if k.startswith("critic/score")}, trainer.global_steps
            )
            times.append(time.perf_counter() - start)
    finally:
        trainer.close()
    return times[warmup:]


class MinimalLoop:
    """The same generate + log-prob + update work with nothing but torch and transformers."""

    def __init__(self) -> None:
        config = load_config([])
        self.cfg = config
        path = os.path.expanduser(config.actor_rollout_ref.model.path)
        self.tokenizer = load_tokenizer(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.01)
        self.generator = torch.Generator().manual_seed(0)
        tok = self.tokenizer
        import pandas as pd

        rows = pd.read_parquet(config.data.train_files).to_dict("records")
        self.rows = [(r["prompt"][0]["content"], r["reward_model"]["ground_truth"]) for r in rows]
        self.pad, self.eos = tok.pad_token_id, tok.eos_token_id

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        chosen = self.rows[step * 32 : (step + 1) * 32]
        ids, answers = [], []
        for prompt, answer in chosen:
            t = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            ids += [[self.pad] * (8 - len(t)) + t] * 8
            answers += [answer] * 8
        input_ids = torch.tensor(ids)
        return input_ids, (input_ids != self.pad).long(), answers

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache
        ).logits[:, -1]
        out, done = [], torch.zeros(len(ids), dtype=torch.bool)
        for t in range(4):
            token = torch.multinomial(logits.softmax(-1), 1, generator=self.generator)[:, 0]
            token = torch.where(done, self.pad, token)
            out.append(token)
            done |= token == self.eos
            if done.all() or t == 3:
                break
            mask = torch.cat([mask, torch.ones(len(ids), 1, dtype=mask.dtype)], 1)
            logits = self.model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=pos[:, -1:] + t + 1,
                past_key_values=cache,
            ).logits[:, -1]
        resp = torch.stack(out, 1)
        return F.pad(resp, (0, 4 - resp.shape[1]), value=self.pad)

    def log_probs(self, seq: torch.Tensor, mask: torch.Tensor, resp: torch.Tensor) -> torch.Tensor:
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=seq, attention_mask=mask, position_ids=pos).logits[:, -5:-1]
        return torch.log_softmax(logits.float(), -1).gather(-1, resp[..., None])[..., 0]

    def step(self, step: int) -> None:
        ids, mask, answers = self.batch(step)
        resp = self.generate(ids, mask)
        resp_mask = ((resp == self.eos).cumsum(-1) - (resp == self.eos).long()).eq(0).long()
        texts = self.tokenizer.batch_decode(resp, skip_special_tokens=True)
        scores = torch.tensor([float(t.strip() == a) for t, a in zip(texts, answers)])
        groups = scores.view(-1, 8)
        adv = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        seq, full_mask = torch.cat([ids, resp], 1), torch.cat([mask, resp_mask], 1)
        with torch.no_grad():
            self.model.eval()
            old = self.log_probs(seq, full_mask, resp)
        self.model.train()
        new = self.log_probs(seq, full_mask, resp)
        ratio = torch.exp(new - old)
        loss = -(torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * resp_mask).sum() / resp_mask.sum()
        self.optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optim.step()


def baseline_step_times(steps: int, warmup: int) -> list[float]:
    torch.set_num_threads(THREADS)
    loop = MinimalLoop()
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        loop.step(step)
        times.append(time.perf_counter() - start)
    return times[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    base = statistics.median(baseline_step_times(args.steps, args.warmup))
    skipped = statistics.median(framework_step_times(args.steps, args.warmup))
    recomputed = statistics.median(
        framework_step_times(args.steps, args.warmup, "trainer.skip_on_policy_old_log_prob=False")
    )
    print(f"minimal torch loop                  : {base * 1000:.1f} ms/step (median of {args.steps})")
    print(f"framework, old-log-prob pass skipped: {skipped * 1000:.1f} ms/step")
    print(f"framework, old-log-prob pass run    : {recomputed * 1000:.1f} ms/step")
    print(f"ratio framework / minimal: {skipped / base:.2f} (skipped), {recomputed / base:.2f} (same work)")


if __name__ == "__main__":
    main()
