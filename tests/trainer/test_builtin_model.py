"""The embedded default's model is warmed up through the SFT trainer, and that run is exactly the
warm-up it stands for: 40 AdamW steps of the token-mean cross-entropy of answer and EOS, written here
as a plain torch loop."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from verl.builtin import task as builtin
from verl.builtin import warmup as builtin_model
from verl.builtin.arith import make_arith_rows


def plain_warmup(model, tokenizer) -> None:
    """The warm-up without the trainer: batches in order, no clipping, no schedule; AdamW is torch's
    fused kernel, the engine's on CPU (the for-loop AdamW differs in the last bit of a few elements a
    step, and 40 steps make that visible)."""
    steps, size = builtin_model.WARMUP_STEPS, builtin_model.WARMUP_BATCH
    rows = make_arith_rows(steps * size, seed=builtin_model.WARMUP_SEED + 1, split="sft")
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=builtin_model.WARMUP_LR, weight_decay=0.0, fused=True
    )
    model.train()
    for step in range(steps):
        input_ids, labels, mask = chat_tensors(rows[step * size : (step + 1) * size], tokenizer)
        logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def chat_tensors(rows: list[dict], tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt + answer + EOS, labels -100 except on answer and EOS, attention mask."""
    sequences, targets = [], []
    for row in rows:
        prompt = tokenizer(row["prompt"][0]["content"], add_special_tokens=False)["input_ids"]
        answer = [*tokenizer(row["reward_model"]["ground_truth"], add_special_tokens=False)["input_ids"], 1]
        sequences.append(prompt + answer)
        targets.append([-100] * len(prompt) + answer)
    width = max(map(len, sequences))
    pad = [tokenizer.pad_token_id] * width
    return (
        torch.tensor([s + pad[len(s) :] for s in sequences]),
        torch.tensor([t + [-100] * (width - len(t)) for t in targets]),
        torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences]),
    )


def test_the_builtin_model_is_the_plain_warmup_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))
    folder = builtin.builtin_model_dir()
    builtin_model.ensure_builtin_model(str(folder))
    built = AutoModelForCausalLM.from_pretrained(folder)

    tokenizer = builtin.build_char_tokenizer()
    assert tokenizer.eos_token_id == 1
    reference = builtin.build_tiny_qwen2(tokenizer, seed=builtin_model.WARMUP_SEED)
    initial = {k: v.clone() for k, v in reference.state_dict().items()}
    plain_warmup(reference, tokenizer)

    expected = reference.state_dict()
    assert sorted(built.state_dict()) == sorted(expected)
    for name, value in built.state_dict().items():
        assert torch.equal(value, expected[name]), name
        assert not torch.equal(value, initial[name]), f"{name} was not trained"
    assert not list(tmp_path.joinpath("cache", "models").glob(".tmp-*"))  # the scratch folder is gone
