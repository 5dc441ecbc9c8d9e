"""The built-in tool task and its tiny model, created on first use (the ``tool_agent_trainer`` preset).

``python -m verl.trainer.main_ppo --config-name tool_agent_trainer`` trains on these: prompts
``"a*b="`` with 3-digit operands (:mod:`verl.builtin.tool_arith`), which a tiny model cannot
multiply in its head, and the ``calculator`` tool (:class:`verl.tools.calculator_tool.CalculatorTool`).
One successful trajectory::

    417*356=                                                                    prompt
    <tool_call>{"name":"calculator","arguments":{"expression":"417*356"}}</tool_call><eos>   model
    <tool_response>148452</tool_response>                                      tool turn
    148452<eos>                                                                 model

The tokenizer is character-level over printable ASCII, plus ``<tool_call>``, ``</tool_call>``,
``<tool_response>`` and ``</tool_response>`` as single (non-special) tokens, as in Qwen's
tokenizers. Its chat template renders user and assistant text as it is and a tool answer between
the ``<tool_response>`` tags; it does not print the tool schemas (the tiny model knows its one
tool from the warm-up). The model is a 2-layer Qwen2 (about 0.1M parameters) warmed up with a
seeded, deterministic SFT on two kinds of demonstrations: calls of the calculator (it learns to
write the call and to copy the operands and the answer) and, more often, answers written directly,
as a model without tools would. So it calls the tool in only about 40% of its samples, and RL has
tool-call success and accuracy to raise. Model and data live in ``$VERL_CACHE_DIR`` (default
``~/.cache/verl``) and are written atomically, like the embedded default's (:mod:`verl.builtin.task`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from verl.builtin.task import tiny_qwen2
from verl.config.actor import TOOL_MODEL_PATH
from verl.utils.cache import build_model_once, cache_dir, resolve_cache_path, write_task_once

logger = logging.getLogger(__name__)

MODEL_NAME = Path(TOOL_MODEL_PATH).name

SPECIALS = ["<pad>", "<eos>", "<unk>"]
TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<tool_response>{{ m['content'] }}</tool_response>"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}<eos>"
    "{% else %}{{ m['content'] }}{% endif %}"
    "{% endfor %}"
)
SFT_STEPS = 400
SFT_SEED = 1
"""The warm-up learns to copy numbers suddenly, after 250-450 steps depending on the seed; with this
seed it has by step 300, so the 400 steps leave a margin."""
SFT_LR = 5e-3
SFT_CALLS = 32
"""Tool-call demonstrations per warm-up step."""
SFT_DIRECT = 48
"""Answers without the tool per warm-up step: the warm-up model calls the tool in about 40% of samples."""


def tool_model_dir() -> Path:
    return resolve_cache_path(TOOL_MODEL_PATH)


def tool_data_dir() -> Path:
    return cache_dir() / "data" / "tool_arith"


def ensure_tool_task_data(*paths: str) -> None:
    """Write the tool task's parquet files if ``paths`` point at them and they are missing."""
    from verl.builtin.tool_arith import write_tool_arith_parquet

    write_task_once(
        tool_data_dir(),
        paths,
        lambda folder: write_tool_arith_parquet(folder, train_size=10_000, test_size=128, seed=0),
        "the built-in tool task",
    )


def ensure_tool_task_model(path: str) -> None:
    """Create, warm up and save the tool model if ``path`` is the built-in one and it is missing."""

    def build(folder: Path) -> None:
        tokenizer = build_tool_tokenizer()
        model = build_tool_model(tokenizer)
        tool_sft_warmup(model, tokenizer, steps=SFT_STEPS, seed=SFT_SEED)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    build_model_once(tool_model_dir(), path, build, "the built-in tool model")


def build_tool_tokenizer():
    """One token per printable ASCII character, plus the tool tags as single tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)]
    vocab = {token: i for i, token in enumerate(SPECIALS + chars + TAGS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    # Matched in text before the pre-tokenizer splits it into characters; kept when decoding.
    core.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAGS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tool_model(tokenizer, seed: int = SFT_SEED):
    """A 2-layer Qwen2 (about 0.1M parameters). RoPE base 100 instead of 10000: the model copies digits
    from fixed offsets, and a small base makes positions easier to tell apart, so the warm-up learns
    to copy in fewer steps."""
    return tiny_qwen2(
        tokenizer,
        seed,
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        rope_theta=100.0,
    )


def tool_call_text(expression: str) -> str:
    """The model's first turn in a demonstration: one Hermes call of the calculator."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


def demonstrations(
    tokenizer, problems: list[tuple[str, str]], use_tool: bool = True
) -> list[tuple[list[int], list[int]]]:
    """Ids and labels (the model's turns only) of one trajectory per ``(prompt, answer)``: the ideal
    tool-using one, or with ``use_tool=False`` the answer given directly (what a model without tools
    does).

    The prompt and the tool turn are what :data:`CHAT_TEMPLATE` renders (the user's text, the answer
    between the ``<tool_response>`` tags), tokenized directly and in one batch: rendering the
    template row by row would take longer than the training."""
    eos = tokenizer.eos_token_id
    prompts, answers = [p for p, _ in problems], [a for _, a in problems]
    texts = prompts + answers
    if use_tool:
        texts += [tool_call_text(p.rstrip("=")) for p in prompts]
        texts += [f"<tool_response>{a}</tool_response>" for a in answers]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    n = len(problems)
    out = []
    for i in range(n):
        prompt, answer = ids[i], [*ids[n + i], eos]
        if not use_tool:
            out.append((prompt + answer, [-100] * len(prompt) + answer))
            continue
        call, tool = [*ids[2 * n + i], eos], ids[3 * n + i]
        labels = [-100] * len(prompt) + call + [-100] * len(tool) + answer
        out.append((prompt + call + tool + answer, labels))
    return out


def tool_sft_warmup(
    model,
    tokenizer,
    steps: int,
    seed: int,
    calls: int = SFT_CALLS,
    direct: int = SFT_DIRECT,
    lr: float = SFT_LR,
) -> None:
    """Supervised warm-up: each step ``calls`` tool-call demonstrations and ``direct`` answers without
    the tool (cross-entropy on the model's turns, summed over both kinds). The model learns to write
    calls and copy numbers, but calls the tool in only about ``calls / (calls + direct)`` of its
    samples: the rest are guesses, which RL learns to give up."""
    from verl.builtin.tool_arith import make_tool_arith_rows

    rows = make_tool_arith_rows(num_rows=steps * (calls + direct), seed=seed + 1, split="sft")
    pairs = [(row["prompt"][0]["content"], row["reward_model"]["ground_truth"]) for row in rows]
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        batch = pairs[step * (calls + direct) : (step + 1) * (calls + direct)]
        demos = demonstrations(tokenizer, batch[:calls])
        guesses = demonstrations(tokenizer, batch[calls:], use_tool=False)
        # two forwards: the short direct answers are not padded to the demonstrations' length
        (loss_1, n_1), (loss_2, n_2) = (
            _summed_loss(model, b, tokenizer.pad_token_id) for b in (demos, guesses)
        )
        loss = (loss_1 + loss_2) / (n_1 + n_2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def _summed_loss(model, pairs: list[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the labelled tokens of right-padded ``pairs``, and their count."""
    if not pairs:
        return torch.zeros(()), 0
    width = max(len(ids) for ids, _ in pairs)
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in pairs])
    labels = torch.tensor([lbl + [-100] * (width - len(lbl)) for _, lbl in pairs])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in pairs])
    logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
    targets = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100, reduction="sum"
    )
    return loss, int((targets != -100).sum())
