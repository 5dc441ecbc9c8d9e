"""trainer.rollout_data_dir / validation_data_dir: verl's <step>.jsonl of input, output, score, step."""

from __future__ import annotations

import json

import numpy as np
import torch

from tests.utils.dataset.char_tokenizer import make_char_tokenizer
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.trainer.ppo.generation_dump import dump_rollouts
from verl.trainer.ppo.validation import Validator


def encode(tokenizer, texts: list[str], width: int, left: bool) -> torch.Tensor:
    rows = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        pad = [tokenizer.pad_token_id] * (width - len(ids))
        rows.append(pad + ids if left else ids + pad)
    return torch.tensor(rows)


def scored_batch(tokenizer) -> DataProto:
    responses = encode(tokenizer, ["7", "12"], 3, left=False)
    return DataProto.from_dict(
        {
            "prompts": encode(tokenizer, ["3+4=", "5+7="], 5, left=True),
            "responses": responses,
            "response_mask": (responses != tokenizer.pad_token_id).long(),
            "token_level_scores": torch.tensor([[1.0, 0, 0], [0.0, 0, 0]]),
        },
        {
            "data_source": np.array(["arith", "arith"], dtype=object),
            "uid": np.array(["1-0", "1-1"], dtype=object),
            "acc": np.array([True, False], dtype=object),
            "reward_model": np.array([{"ground_truth": "7"}, {"ground_truth": "12"}], dtype=object),
            "extra_info": np.array([{"index": 0}, {"index": 1}], dtype=object),
        },
    )


def read_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rollouts_are_dumped_as_verl_does(tmp_path):
    tokenizer = make_char_tokenizer()
    path = dump_rollouts(scored_batch(tokenizer), tokenizer, str(tmp_path / "rollouts"), step=3)
    assert path == str(tmp_path / "rollouts" / "3.jsonl")
    first, second = read_lines(tmp_path / "rollouts" / "3.jsonl")
    assert first == {
        "input": "3+4=",
        "output": "7",
        "gts": "7",
        "score": 1.0,
        "step": 3,
        "data_source": "arith",
        "uid": "1-0",
        "acc": True,
    }
    assert (second["output"], second["score"], second["acc"]) == ("12", 0.0, False)


def test_no_folder_writes_nothing(tmp_path):
    tokenizer = make_char_tokenizer()
    assert dump_rollouts(scored_batch(tokenizer), tokenizer, None, step=1) is None


class FakeRollout:
    """Answers every prompt with the responses of ``scored_batch``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        batch = scored_batch(self.tokenizer)
        return batch.select(batch_keys=["prompts", "responses", "response_mask"], non_tensor_batch_keys=[])


def test_validation_generations_are_dumped(tmp_path):
    tokenizer = make_char_tokenizer()
    config = load_config([f"trainer.validation_data_dir={tmp_path / 'val'}"])
    rows = scored_batch(tokenizer)
    loader = [
        {
            "input_ids": rows.batch["prompts"],
            "attention_mask": torch.ones_like(rows.batch["prompts"]),
            "position_ids": torch.zeros_like(rows.batch["prompts"]),
            "data_source": rows.non_tensor_batch["data_source"],
            "reward_model": rows.non_tensor_batch["reward_model"],
        }
    ]

    def reward_fn(batch, return_dict=True):
        return {
            "reward_tensor": torch.tensor([[1.0, 0, 0], [0.0, 0, 0]]),
            "reward_extra_info": {"acc": [1, 0]},
        }

    validator = Validator(config, tokenizer, FakeRollout(tokenizer), reward_fn, tracker=None, loader=loader)
    validator.run(step=5)
    first, second = read_lines(tmp_path / "val" / "5.jsonl")
    assert (first["input"], first["output"], first["gts"], first["score"], first["step"]) == (
        "3+4=",
        "7",
        "7",
        1.0,
        5,
    )
    assert (second["acc"], second["data_source"]) == (0, "arith")
