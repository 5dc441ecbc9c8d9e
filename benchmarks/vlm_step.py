"""A vision-language GRPO step on CPU: throughput, and how much of it the vision encoder takes.

    .venv/bin/python benchmarks/vlm_step.py [--steps 10] [key=value ...]

Part 1 trains the built-in VLM preset (``--config-name vlm_trainer``: 32 prompts x 8 samples, one
56x56 image each, the tiny Qwen2-VL) for ``--steps`` steps after 2 warm-up steps with the hf
rollout, and prints tokens/s and the phase times. vLLM is not measured: its CPU build cannot load
Qwen2-VL here (docs/vlm.md).

Part 2 times, in this process on the same batch shape, a training forward + backward of the model
and the vision encoder's share of it (forward hooks around ``model.visual``), and the same forward
for the text of the prompts alone (image tokens kept, no pictures encoded): the ratio is what the
images cost per step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verl.builtin import vision_task
from verl.builtin.assets import prepare_ppo_assets
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo import builders


def train(steps: int, overrides: list[str]) -> dict[str, float]:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = load_config(["trainer.logger=[]", "trainer.val_before_train=False", *overrides], "vlm_trainer")
    config.trainer.total_training_steps = steps + 2
    prepare_ppo_assets(config)
    builders.init_ray(config)
    trainer = RayPPOTrainer(config)
    keys = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "perf/total_num_tokens")
    totals = dict.fromkeys(keys, 0.0)
    try:
        trainer.init_workers()
        batches = trainer._batches()
        for step in range(steps + 2):
            trainer.global_steps = step + 1
            metrics = trainer.train_step(next(batches))
            if step >= 2:
                for key in keys:
                    totals[key] += metrics[key]
    finally:
        trainer.close()
    return totals


def forward_backward(model, inputs: dict[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    model(**inputs).logits.float().logsumexp(-1).mean().backward()
    return time.perf_counter() - start


def vision_share(repeats: int = 9) -> tuple[float, float]:
    """Medians of (the vision encoder's forward / the whole forward+backward) and (forward+backward
    with images / the same tokens without pictures)."""
    from verl.utils.dataset.vision import VisionProcessor, image_messages, load_image

    tokenizer = vision_task.build_vision_tokenizer()
    model = vision_task.build_tiny_qwen2_vl(tokenizer)
    processor = VisionProcessor(
        vision_task.build_image_processor(), "<|image_pad|>", model.config.image_token_id, 2
    )
    rows = vision_task.make_vision_rows(256, 0, "bench")
    vision = processor.images([load_image(r["images"][0], "bench") for r in rows])
    text = tokenizer.apply_chat_template(
        image_messages(rows[0]["prompt"], 1, "bench"), add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(
        [processor.expand(text, vision["image_grid_thw"][:1]) + "12"] * len(rows), return_tensors="pt"
    )
    token_types = (ids["input_ids"] == processor.image_token_id).int()
    with_images = dict(ids, mm_token_type_ids=token_types, **vision)
    forward_backward(model, with_images), forward_backward(model, dict(ids))  # warm-up of both
    spent: list[float] = []
    model.model.visual.register_forward_pre_hook(lambda *_: spent.append(-time.perf_counter()))
    model.model.visual.register_forward_hook(lambda *_: spent.append(time.perf_counter()))
    shares, ratios = [], []
    for _ in range(repeats):  # alternated, medians: the machine may be shared
        spent.clear()
        total = forward_backward(model, with_images)
        shares.append(sum(spent) / total)
        ratios.append(total / forward_backward(model, dict(ids)))
    return statistics.median(shares), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    args, overrides = parser.parse_known_args()
    totals = train(args.steps, overrides)
    step = totals["timing_s/step"] / args.steps
    print(
        f"hf rollout, {args.steps} steps: {totals['perf/total_num_tokens'] / totals['timing_s/step']:.0f} tokens/s, "
        f"{step:.2f} s/step (gen {totals['timing_s/gen'] / args.steps:.2f} s, "
        f"update {totals['timing_s/update_actor'] / args.steps:.2f} s)"
    )
    share, ratio = vision_share()
    print(
        f"vision encoder forward: {share:.1%} of a training forward+backward; with images / text only: {ratio:.2f}x"
    )


if __name__ == "__main__":
    main()
