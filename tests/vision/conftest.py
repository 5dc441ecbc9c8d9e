"""A freshly initialised tiny Qwen2-VL, its tokenizer and image processor, and prompts with 0, 1 or 2
images of different sizes (no warm-up: these tests compare computations, not accuracy)."""

from __future__ import annotations

import io
import random

import pytest
import torch

from verl.builtin import vision_task
from verl.utils.dataset.vision import VisionProcessor, image_messages, load_image


def random_png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    rng = random.Random(seed)
    image = Image.frombytes(
        "RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3))
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def tiny_vlm():
    tokenizer = vision_task.build_vision_tokenizer()
    model = vision_task.build_tiny_qwen2_vl(tokenizer, seed=3).eval()
    processor = VisionProcessor(
        vision_task.build_image_processor(), "<|image_pad|>", model.config.image_token_id, 2
    )
    return tokenizer, model, processor


# (prompt text, image sizes): mixed counts (0, 1, 2) and sizes per sample
MIXED_PROMPTS = [
    ("<image>=", [(56, 56)]),
    ("12+3=", []),
    ("<image>+<image>=", [(84, 56), (56, 112)]),
    ("7<image>=", [(112, 84)]),
]


def encode(tokenizer, processor: VisionProcessor, text: str, sizes: list[tuple[int, int]], seed: int):
    """Token ids and image inputs of one prompt, as the dataset makes them."""
    images = [load_image({"bytes": random_png(w, h, seed + i)}, "test") for i, (w, h) in enumerate(sizes)]
    messages = image_messages([{"role": "user", "content": text}], len(images), "test")
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    vision = processor.images(images) if images else {}
    if vision:
        rendered = processor.expand(rendered, vision["image_grid_thw"])
    return tokenizer(rendered, add_special_tokens=False)["input_ids"], vision


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask
