"""Freshly initialised tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL models with their tokenizer and image
processor, and prompts with 0, 1 or 2 images of different sizes (no warm-up: these tests compare
computations, not accuracy)."""

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


def _family_config(name: str, tokenizer):
    """A tiny config of Qwen2.5-VL or Qwen3-VL over the built-in vision vocabulary, and its patch size."""
    from transformers import Qwen2_5_VLConfig, Qwen3VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in vision_task.VISION_TOKENS}
    common = {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": True,
    }
    text = {
        "vocab_size": len(vision_task.VISION_VOCAB),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    vision = {"depth": 2, "hidden_size": 32, "out_hidden_size": 64, "intermediate_size": 64, "num_heads": 2}
    if name == "qwen2_5_vl":  # windowed attention in the vision tower, a full-attention block
        rope = {"type": "mrope", "mrope_section": [2, 3, 3]}
        vision_config = {**vision, "patch_size": 14, "window_size": 56, "fullatt_block_indexes": [1]}
        return Qwen2_5_VLConfig(
            text_config={**text, "rope_scaling": rope}, vision_config=vision_config, **common
        ), 14
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}  # qwen3_vl
    vision_config = {
        **vision,
        "patch_size": 16,
        "deepstack_visual_indexes": [0],
        "num_position_embeddings": 64,
    }
    text_config = {**text, "head_dim": 16, "rope_scaling": rope}
    return Qwen3VLConfig(text_config=text_config, vision_config=vision_config, **common), 16


def tiny_family(name: str):
    """(tokenizer, a freshly initialised tiny model of the family, its VisionProcessor)."""
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = vision_task.build_vision_tokenizer()
    if name == "qwen2_vl":
        model, patch = vision_task.build_tiny_qwen2_vl(tokenizer, seed=3), 14
    else:
        config, patch = _family_config(name, tokenizer)
        torch.manual_seed(3)
        model = AutoModelForImageTextToText.from_config(config)
    images = Qwen2VLImageProcessorPil(patch_size=patch, min_pixels=56 * 56, max_pixels=4 * 56 * 56)
    return tokenizer, model.eval(), VisionProcessor(images, "<|image_pad|>", model.config.image_token_id, 2)


FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def tiny_vlm():
    return tiny_family("qwen2_vl")


@pytest.fixture(scope="module", params=FAMILIES)
def vlm_family(request):
    """Each family of the Qwen-VL line in turn (their M-RoPE, vision towers and image blocks)."""
    return tiny_family(request.param)


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
