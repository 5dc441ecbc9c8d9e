"""A tiny Qwen2-VL that has memorised one tool-using conversation with two pictures, so the real hf
rollout server, driven by the tool agent loop, replays it under greedy decoding.

The conversation: a picture and ``look``; the model calls ``zoom``; the tool
(:class:`tests.vision.image_tools.ZoomTool`) answers with a second picture and ``zoomed``; the model
answers ``7``. Tokenizer: printable ASCII one character a token plus Qwen2-VL's vision tokens; the
chat template writes tool answers between ``<r>`` and ``</r>`` and ``>`` as the generation prompt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import torch

from tests.vision.conftest import random_png
from tests.vision.image_tools import tool_image
from verl.builtin import vision_task
from verl.utils.dataset.vision import VisionProcessor, image_messages, load_image
from verl.workers.vision import micro_batch_vision

PROMPT = "<image>look"
CALL = '<tool_call>{"name":"zoom","arguments":{}}</tool_call>'
TOOL_TURN = "<r><|vision_start|><|image_pad|><|vision_end|>zoomed</r>>"
ANSWER = "7"
PROMPT_IMAGE = (56, 56)  # 4 image tokens
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}<r>{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}{% if m['role'] == 'tool' %}</r>{% endif %}"
    "{% if m['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
)


def build_tokenizer():
    """Printable ASCII one character a token, plus Qwen2-VL's vision tokens; tool answers in ``<r>``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = ["<pad>", "<eos>", "<unk>", *vision_task.VISION_TOKENS, *(chr(c) for c in range(32, 127))]
    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"<\|[a-z_]+\|>|."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def prompt_image():
    return load_image({"bytes": random_png(*PROMPT_IMAGE, seed=3)}, "test")


def conversation(tokenizer, processor) -> tuple[list[int], list[int], dict[str, torch.Tensor]]:
    """The memorised conversation's ids, its labels (the two model turns) and its two images' inputs."""
    first, second = processor.images([prompt_image()]), processor.images([tool_image()])
    messages = image_messages([{"role": "user", "content": PROMPT}], 1, "test")
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = processor.expand_ids(tokenizer(prompt)["input_ids"], first["image_grid_thw"])
    call = tokenizer(CALL)["input_ids"] + [tokenizer.eos_token_id]
    tool = processor.expand_ids(tokenizer(TOOL_TURN)["input_ids"], second["image_grid_thw"])
    answer = tokenizer(ANSWER)["input_ids"] + [tokenizer.eos_token_id]
    ids = prompt_ids + call + tool + answer
    labels = [-100] * len(prompt_ids) + call + [-100] * len(tool) + answer
    return ids, labels, micro_batch_vision([first, second])


def build_tool_vlm(path: str, steps: int = 150) -> None:
    """A tiny Qwen2-VL that replays :func:`conversation` under greedy decoding (checked by margin)."""
    tokenizer = build_tokenizer()
    image_processor = vision_task.build_image_processor()
    token = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    processor = VisionProcessor(image_processor, "<|image_pad|>", token, 2)
    model = vision_task.build_tiny_qwen2_vl(tokenizer, seed=0)
    model.resize_token_embeddings(len(tokenizer))
    ids, labels, vision = conversation(tokenizer, processor)
    ids, labels = torch.tensor([ids]), torch.tensor([labels])
    inputs = {"input_ids": ids, "mm_token_type_ids": (ids == processor.image_token_id).int(), **vision}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    model.train()
    for _ in range(steps):
        loss = model(**inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    with torch.no_grad():
        logits = model(**inputs).logits[0, :-1]
    trained = labels[0, 1:] != -100
    best, second = logits.topk(2, dim=-1).values.unbind(-1)
    replayed = (logits.argmax(-1) == labels[0, 1:]) & (best - second > 1.0)
    assert bool(replayed[trained].all()), "the tiny VLM did not memorise its conversation"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    image_processor.save_pretrained(path)


def cached_tool_vlm() -> str:
    """The memorised model, built once per version of this file under ``$VERL_CACHE_DIR/test-models``."""
    from verl.utils.cache import cache_dir

    sources = [Path(__file__), Path(__file__).with_name("image_tools.py")]  # the model and the tool's picture
    version = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:12]
    path = cache_dir() / "test-models" / f"tool-vlm-{version}"
    if not (path / "config.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(dir=path.parent, prefix=".building-")
        build_tool_vlm(staging)
        try:
            os.rename(staging, path)  # atomic: a half-built model is never found
        except OSError:  # built meanwhile by another process
            shutil.rmtree(staging, ignore_errors=True)
    return str(path)
