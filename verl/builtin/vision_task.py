"""The built-in vision-language task and tiny model (``--config-name vlm_trainer``), made on first use.

Each prompt is one image of a digit drawn as seven segments (random colour, thickness and offset,
on a noisy background) followed by ``=``; the answer is the digit (``data_source="vision_digits"``,
scored by exact match). The model is a Qwen2-VL (a one-block vision tower, a two-layer language
model, about 0.2M parameters) over the built-in character vocabulary plus Qwen2-VL's vision tokens;
its image processor makes a 56x56 image 16 patches, 4 tokens. A short warm-up (supervised, on
other images than the task's) gives it some accuracy, so RL starts with signal. Everything is
written under the cache dir, atomically, like the text default (:mod:`verl.builtin.task`).
"""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import torch

from verl.builtin.task import CHAR_VOCAB
from verl.config.actor import VISION_MODEL_PATH
from verl.utils.cache import CACHE_DIR_EXPR, build_model_once, cache_dir, resolve_cache_path, write_task_once
from verl.utils.dataset.schema import make_row, write_splits
from verl.utils.dataset.vision import VisionProcessor, image_messages, load_image

VISION_DATA_SOURCE = "vision_digits"
VISION_TRAIN_FILE = f"{CACHE_DIR_EXPR}/data/vision_digits/train.parquet"
VISION_VAL_FILE = f"{CACHE_DIR_EXPR}/data/vision_digits/test.parquet"
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
VISION_VOCAB = [*CHAR_VOCAB, *VISION_TOKENS]
IMAGE_SIZE = 56
# a user message's text, and each of its image parts as Qwen2-VL's image block
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}"
)
WARMUP_STEPS = 90
WARMUP_BATCH = 64
WARMUP_LR = 1e-3
WARMUP_SEED = 0

# the seven segments (a..g) as boxes on a 5 x 9 grid of cells: (x0, y0, x1, y1)
_SEGMENTS = {
    "a": (1, 0, 4, 1),
    "b": (4, 1, 5, 4),
    "c": (4, 5, 5, 8),
    "d": (1, 8, 4, 9),
    "e": (0, 5, 1, 8),
    "f": (0, 1, 1, 4),
    "g": (1, 4, 4, 5),
}
_DIGIT_SEGMENTS = ["abcdef", "bc", "abdeg", "abcdg", "bcfg", "acdfg", "acdefg", "abc", "abcdefg", "abcdfg"]


def vision_model_dir() -> Path:
    return resolve_cache_path(VISION_MODEL_PATH)


def vision_data_dir() -> Path:
    return cache_dir() / "data" / "vision_digits"


def digit_image(digit: int, rng: random.Random, size: int = IMAGE_SIZE) -> bytes:
    """PNG bytes of ``digit`` in seven segments, its colour, stroke and place drawn from ``rng``."""
    from PIL import Image, ImageDraw

    background = tuple(rng.randint(0, 80) for _ in range(3))
    image = Image.new("RGB", (size, size), background)
    draw = ImageDraw.Draw(image)
    colour = tuple(rng.randint(150, 255) for _ in range(3))
    cell = 5
    left, top = rng.randint(14, 18), rng.randint(4, 6)
    for name in _DIGIT_SEGMENTS[digit]:
        x0, y0, x1, y1 = _SEGMENTS[name]
        draw.rectangle(
            [left + x0 * cell, top + y0 * cell, left + x1 * cell - 1, top + y1 * cell - 1], fill=colour
        )
    for _ in range(10):  # specks of noise
        x, y = rng.randrange(size), rng.randrange(size)
        image.putpixel((x, y), tuple(rng.randint(0, 255) for _ in range(3)))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def make_vision_rows(num_rows: int, seed: int, split: str) -> list[dict[str, Any]]:
    """Schema rows ``<image>=`` -> the digit, with the image in verl's ``images`` column."""
    rng = random.Random(f"vision_digits:{seed}:{split}")
    rows = []
    for index in range(num_rows):
        digit = rng.randrange(10)
        row = make_row(VISION_DATA_SOURCE, "<image>=", "vision", str(digit), split, index)
        row["images"] = [{"bytes": digit_image(digit, rng)}]
        rows.append(row)
    return rows


def ensure_vision_task_data(*paths: str) -> None:
    """Write the task's parquet files if ``paths`` point at them and they are missing."""

    def write(folder: Path) -> None:
        write_splits(
            {"train": make_vision_rows(4096, 0, "train"), "test": make_vision_rows(200, 0, "test")}, folder
        )

    write_task_once(vision_data_dir(), paths, write, "the built-in vision task")


def ensure_vision_model(path: str) -> None:
    """Create, warm up and save the tiny VLM if ``path`` is the built-in one and missing."""
    build_model_once(vision_model_dir(), path, build_vision_model, "the built-in tiny vision-language model")


def build_vision_tokenizer():
    """The character tokenizer of the text default plus the vision tokens, each one token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(VISION_VOCAB)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"<\|[a-z_]+\|>|."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    return tokenizer


def build_image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        min_pixels=IMAGE_SIZE * IMAGE_SIZE, max_pixels=4 * IMAGE_SIZE * IMAGE_SIZE
    )


def build_tiny_qwen2_vl(tokenizer, seed: int = WARMUP_SEED):
    """A freshly initialised tiny Qwen2-VL (seeded) with tied embeddings."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    special = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    text = dict(
        vocab_size=len(VISION_VOCAB),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        **special,
    )
    vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, in_channels=3)
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
        **special,
    )
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config)


def build_vision_model(folder: Path, steps: int = WARMUP_STEPS) -> None:
    """Initialise the tiny VLM, warm it up on ``steps`` batches of digit images and save it with its
    tokenizer and image processor in ``folder``."""
    tokenizer = build_vision_tokenizer()
    image_processor = build_image_processor()
    model = build_tiny_qwen2_vl(tokenizer)
    rows = make_vision_rows(steps * WARMUP_BATCH, WARMUP_SEED + 1, "warmup")
    supervised_warmup(model, tokenizer, image_processor, rows, WARMUP_BATCH, WARMUP_LR, WARMUP_SEED)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    image_processor.save_pretrained(folder)


def supervised_warmup(
    model, tokenizer, image_processor, rows: list[dict[str, Any]], batch: int, lr: float, seed: int
):
    """Train ``model`` on ``rows`` (in order, ``batch`` at a time) to answer each prompt with its
    ground truth and EOS: the cross-entropy of those tokens, AdamW without weight decay."""
    merge = model.config.vision_config.spatial_merge_size
    image_token = "<|image_pad|>"
    vision = VisionProcessor(
        image_processor, image_token, tokenizer.convert_tokens_to_ids(image_token), merge
    )
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for start in range(0, len(rows) - batch + 1, batch):
        inputs, labels = _warmup_batch(rows[start : start + batch], tokenizer, vision)
        logits = model(**inputs).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def _warmup_batch(rows, tokenizer, vision: VisionProcessor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Right-padded prompt + answer + EOS ids with the images' inputs; labels are -100 but on the answer."""
    sequences, answers, pixels, grids = [], [], [], []
    for row in rows:
        images = vision.images([load_image(i, "warm-up row") for i in row["images"]])
        prompt = tokenizer.apply_chat_template(
            image_messages(row["prompt"], len(row["images"]), "warm-up row"),
            add_generation_prompt=True,
            tokenize=False,
        )
        prompt_ids = tokenizer(vision.expand(prompt, images["image_grid_thw"]), add_special_tokens=False)[
            "input_ids"
        ]
        answer = tokenizer(row["reward_model"]["ground_truth"], add_special_tokens=False)["input_ids"]
        sequences.append(prompt_ids + answer + [tokenizer.eos_token_id])
        answers.append(len(answer) + 1)
        pixels.append(images["pixel_values"])
        grids.append(images["image_grid_thw"])
    width = max(len(s) for s in sequences)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (seq, n) in enumerate(zip(sequences, answers)):
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(seq) - n : len(seq)] = torch.tensor(seq[-n:])
    mask = torch.arange(width) < torch.tensor([len(s) for s in sequences])[:, None]
    inputs = {
        "input_ids": ids,
        "attention_mask": mask.long(),
        "pixel_values": torch.cat(pixels),
        "image_grid_thw": torch.cat(grids),
        "mm_token_type_ids": (ids == vision.image_token_id).int(),
    }
    return inputs, labels
