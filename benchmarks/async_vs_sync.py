"""Async off-policy vs synchronous training on the same 2 cores, at equal wall time.

    .venv/bin/python benchmarks/async_vs_sync.py [--seconds 60] [--max-staleness 1] [key=value ...]

Both train the embedded default (GRPO, 32 prompts x 8 samples, the tiny model):

* sync: the hybrid engine, one worker process with 2 torch threads that generates, then trains;
* async: a rollout process (1 thread) generating ahead while a trainer process (1 thread)
  trains, ``max_staleness`` versions apart, with the decoupled PPO loss (TIS cap 2);
* fully async (``--fully-async T K``): the same pools under verl's fully-async keys, a weight sync
  every ``K`` updates and ``staleness_threshold=T`` (the fully_async_main preset's bypass loss);
* with ``--stream`` also fully async on the rollout server (``rollout.mode=async``), once with one
  request per step batch and once streamed prompt by prompt (``data.gen_batch_size=1``, verl's), where a
  step trains the prompts that finish first.

Each trains for the same wall-clock budget (after 3 warm-up steps), then runs greedy
validation. Prints samples/s, steps, validation accuracy of each, and the throughput ratio
async / sync.
"""

from __future__ import annotations

import argparse
import time

from verl.builtin.assets import prepare_ppo_assets
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo import builders

ACC = "val-core/arith/acc/mean@1"


def train_for(overrides: list[str], seconds: float, warmup: int = 3) -> dict[str, float]:
    from verl.trainer.ppo.async_trainer import AsyncPPOTrainer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = load_config(["trainer.logger=[console]", "trainer.total_training_steps=10000", *overrides])
    prepare_ppo_assets(config)
    builders.init_ray(config)
    trainer = (AsyncPPOTrainer if config.trainer.mode == "async" else RayPPOTrainer)(config)
    try:
        trainer.init_workers()
        before = trainer.validator.run(0)[ACC]
        trainer.batches = trainer._batches()
        start = None
        timings: dict[str, float] = {}
        while start is None or time.perf_counter() - start < seconds:
            if trainer.global_steps == warmup:
                start = time.perf_counter()
            trainer.global_steps += 1
            metrics = trainer.train_step(next(trainer.batches))
            if start is not None:
                for key, value in metrics.items():
                    if key.startswith("timing_s/"):
                        phase = key.removeprefix("timing_s/")
                        timings[phase] = timings.get(phase, 0.0) + value
        elapsed = time.perf_counter() - start
        steps = trainer.global_steps - warmup
        rows = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
        after = trainer.validator.run(trainer.global_steps)[ACC]
    finally:
        trainer.close()
    phases = {k: v / steps for k, v in timings.items()}
    return {
        "samples_per_s": steps * rows / elapsed,
        "steps": steps,
        "acc_before": before,
        "acc_after": after,
        "phases": phases,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument(
        "--trainer-threads",
        type=int,
        default=1,
        help="async trainer threads; 2 oversubscribes the 2 cores (the rollout keeps 1) when generation is short",
    )
    parser.add_argument(
        "overrides", nargs="*", help="extra config overrides for both runs, e.g. data.max_response_length=48"
    )
    parser.add_argument(
        "--fully-async",
        nargs=2,
        metavar=("THRESHOLD", "SYNC_STEP"),
        help="also run verl's fully-async keys: staleness_threshold and trigger_parameter_sync_step",
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="with --fully-async: also on the rollout server, per step batch and streamed (data.gen_batch_size=1)",
    )
    args = parser.parse_args()
    common = ["trainer.n_gpus_per_node=1", "data.val_max_samples=200", *args.overrides]
    pools = [
        f"trainer.cpus_per_worker={args.trainer_threads}",
        "async_training.rollout_cpus_per_worker=1",
        f"ray_init.num_cpus={args.trainer_threads + 1}",
        "trainer.mode=async",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    ]
    runs = {
        "sync": [*common, "trainer.cpus_per_worker=2"],
        "async": [
            *common,
            *pools,
            f"async_training.max_staleness={args.max_staleness}",
            "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
        ],
    }
    if args.fully_async:
        threshold, sync_step = args.fully_async
        runs["fully"] = [
            *common,
            *pools,
            f"async_training.staleness_threshold={threshold}",
            f"async_training.trigger_parameter_sync_step={sync_step}",
            "async_training.use_rollout_log_probs=True",
        ]
        if args.stream:
            runs["server"] = [*runs["fully"], "actor_rollout_ref.rollout.mode=async"]
            runs["stream"] = [*runs["server"], "data.gen_batch_size=1"]
    results = {name: train_for(overrides, args.seconds) for name, overrides in runs.items()}
    for name, r in results.items():
        print(
            f"{name:6s} {r['samples_per_s']:7.1f} samples/s  {r['steps']:4d} steps in {args.seconds:.0f}s  "
            f"val acc {r['acc_before']:.3f} -> {r['acc_after']:.3f}"
        )
        print("       mean s/step: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["phases"].items())))
    for name in results.keys() - {"sync"}:
        ratio = results[name]["samples_per_s"] / results["sync"]["samples_per_s"]
        print(f"throughput ratio {name}/sync: {ratio:.2f}")


if __name__ == "__main__":
    main()
