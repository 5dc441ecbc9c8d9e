"""A tiny model that has memorised a few tool-using conversations, so a real engine emits real
tool calls (greedy decoding replays them token for token).

Character-level tokenizer (printable ASCII) plus one multi-character token, ``<84>``, that the
pre-tokenizer never produces from text: when the model emits it, decoding gives "84" and
re-encoding gives the two tokens "8", "4" (a case where decode-then-encode changes the ids).
Chat template: user and assistant contents as they are, tool answers between ``<r>`` and
``</r>``, and ``>`` as the generation prompt. ``Q7`` answers wrong, is told so by a simulated user
(an interaction of tests/interactions), and answers again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

ANSWER_TOKEN = "<84>"
SPECIALS = ["<pad>", "<eos>", "<unk>", ANSWER_TOKEN]
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}<r>{{ m['content'] }}</r>"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
)


def call(name: str, arguments: dict) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
        + "</tool_call>"
    )


USER_RETRY = "No.Again?"
"""The user's reply to Q7's first answer. Without spaces, as every text here: the saved tokenizer is
loaded back as Qwen2's (the model's type), whose byte-level pre-tokenizer drops them."""

# prompt -> the model's turns (a turn is a list of pieces: text, or ANSWER_TOKEN), and the answers
# between them: a tool's (a string, as the test's tools return it) or a user's ({"user": text})
CONVERSATIONS = {
    "Q1": ([[call("calculator", {"expression": "12*7"})], [ANSWER_TOKEN]], ["84"]),
    "Q2": ([['<tool_call>{"name":"calculator",</tool_call>']], []),
    "Q3": ([[call("search", {"q": "x"})]], []),
    "Q4": ([[call("boom", {})]], []),
    "Q5": ([[call("wait", {})]], []),
    "Q6": ([["7"]], []),
    "Q7": ([["7"], [ANSWER_TOKEN]], [{"user": USER_RETRY}]),
}


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)]
    vocab = {token: i for i, token in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def encode_turn(tokenizer, pieces: list[str]) -> list[int]:
    ids: list[int] = []
    for piece in pieces:
        if piece == ANSWER_TOKEN:
            ids.append(tokenizer.convert_tokens_to_ids(ANSWER_TOKEN))
        else:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return [*ids, tokenizer.eos_token_id]


def conversation_ids(tokenizer, prompt: str) -> tuple[list[int], list[int]]:
    """Ids of the whole memorised conversation, and the labels (model turns only)."""
    turns, answers = CONVERSATIONS[prompt]
    base = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    base = list(base["input_ids"] if hasattr(base, "keys") else base)
    ids, labels = base, [-100] * len(base)
    for i, turn in enumerate(turns):
        turn_ids = encode_turn(tokenizer, turn)
        ids += turn_ids
        labels += turn_ids
        if i < len(answers):
            answer = answers[i]
            text = f"{answer['user']}>" if isinstance(answer, dict) else f"<r>{answer}</r>>"
            context = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += context
            labels += [-100] * len(context)
    return ids, labels


def cached_tool_model() -> str:
    """The model, built once per version of this file under ``$VERL_CACHE_DIR/test-models``."""
    from verl.utils.cache import cache_dir

    version = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    path = cache_dir() / "test-models" / f"tool-model-{version}"
    if not (path / "config.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(dir=path.parent, prefix=".building-")
        build_tool_model(staging)
        try:
            os.rename(staging, path)  # atomic: a half-built model is never found
        except OSError:  # built meanwhile by another process
            shutil.rmtree(staging, ignore_errors=True)
    return str(path)


def build_tool_model(path: str, steps: int = 300) -> str:
    """Train (memorise) and save the model and tokenizer under ``path``; returns ``path``.

    The learning rate decays linearly to 0: at a constant 1e-2 the last steps still jump around, and
    on some CPUs the saved model got one token of a conversation wrong. The build checks that every
    trained token is the greedy choice by a clear margin, so the tests' greedy rollouts replay them."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    rows = [conversation_ids(tokenizer, p) for p in CONVERSATIONS]
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in rows])
    labels = torch.tensor([lbl + [-100] * (width - len(lbl)) for _, lbl in rows])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
    trained = labels[:, 1:] != -100
    best, second = logits.topk(2, dim=-1).values.unbind(-1)
    replayed = (logits.argmax(-1) == labels[:, 1:]) & (best - second > 1.0)
    if not bool(replayed[trained].all()):
        raise RuntimeError(f"the tool model did not memorise its conversations in {steps} steps")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
