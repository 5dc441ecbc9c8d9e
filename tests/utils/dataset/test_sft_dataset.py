"""The SFT dataset on real parquet files and a real (character-level) fast tokenizer: the loss mask
covers exactly the assistant's turns, tool calls included; pair rows equal chat rows; bad rows name
themselves."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.utils.dataset.char_tokenizer import make_char_tokenizer
from verl.config.sft_trainer import MultiturnConfig, SFTDataConfig
from verl.utils.dataset.schema import DatasetError
from verl.utils.dataset.sft_dataset import SFTDataset, sft_collate

TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | length }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments }}</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CALL = {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
TOOL_SCHEMA = {
    "type": "function",
    "function": {"name": "add", "description": "a+b", "parameters": {"type": "object"}},
}
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "It is 5."},
]


def write(tmp_path, rows, name="data.parquet"):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def dataset(path, template=TEMPLATE, **config):
    return SFTDataset(path, make_char_tokenizer(template), SFTDataConfig(**config))


def masked_segments(tokenizer, item):
    """The decoded runs of consecutive trained-on tokens."""
    segments, run = [], []
    for token, on in zip(item["input_ids"], item["loss_mask"]):
        if on:
            run.append(token)
        elif run:
            segments.append(tokenizer.decode(run))
            run = []
    if run:
        segments.append(tokenizer.decode(run))
    return segments


def test_loss_mask_covers_exactly_the_assistant_turns_with_tool_calls(tmp_path):
    # a second row without tool calls makes parquet fill the absent struct fields with nulls
    path = write(tmp_path, [{"messages": CHAT, "tools": [TOOL_SCHEMA]}, {"messages": CHAT[:2] + CHAT[4:]}])
    data = dataset(path)
    item = data[0]
    assert masked_segments(data.tokenizer, item) == [
        '<tool_call>add {"a": 2, "b": 3}</tool_call><|im_end|>\n',
        "It is 5.<|im_end|>\n",
    ]
    text = data.tokenizer.decode(item["input_ids"])
    assert text.startswith("<|im_start|>system\nTools: 1<|im_end|>\n")  # the row's tools reach the template
    assert "<tool_response>5</tool_response>" in text
    assert masked_segments(data.tokenizer, data[1]) == ["It is 5.<|im_end|>\n"]


def test_prompt_response_pairs_equal_the_same_chat(tmp_path):
    pairs = dataset(write(tmp_path, [{"prompt": "What is 2+3?", "response": "5"}], "pairs.parquet"))
    chats = dataset(
        write(
            tmp_path,
            [
                {
                    "messages": [
                        {"role": "user", "content": "What is 2+3?"},
                        {"role": "assistant", "content": "5"},
                    ]
                }
            ],
        )
    )
    assert pairs[0] == chats[0]
    assert masked_segments(pairs.tokenizer, pairs[0]) == ["5<|im_end|>\n"]


def test_collate_right_pads_and_keeps_masks():
    batch = sft_collate(
        [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [1]}], 0
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 1, 2]]


def test_truncation_modes(tmp_path):
    path = write(tmp_path, [{"messages": CHAT[:2] + CHAT[4:]}])
    full = dataset(path)[0]
    with pytest.raises(DatasetError, match=r"row 0.*longer than data.max_length=20"):
        dataset(path, max_length=20)[0]
    left = dataset(path, max_length=20, truncation="left")[0]
    right = dataset(path, max_length=20, truncation="right")[0]
    assert left["input_ids"] == full["input_ids"][-20:] and left["loss_mask"] == full["loss_mask"][-20:]
    assert right["input_ids"] == full["input_ids"][:20] and sum(right["loss_mask"]) == 0


def test_bad_rows_and_files_name_themselves(tmp_path):
    with pytest.raises(DatasetError, match=r"cols.parquet.*'messages'.*'prompt'.*'response'"):
        dataset(write(tmp_path, [{"question": "q"}], "cols.parquet"))
    with pytest.raises(DatasetError, match=r"multiturn.enable=True"):
        dataset(
            write(tmp_path, [{"prompt": "q", "response": "a"}], "pair.parquet"),
            multiturn=MultiturnConfig(enable=True),
        )
    no_answer = dataset(
        write(tmp_path, [{"messages": CHAT[:2]}, {"messages": CHAT[:2]}], "user_only.parquet")
    )
    with pytest.raises(DatasetError, match=r"row 1.*no assistant message"):
        no_answer[1]
    # a template that marks the last message renders a prefix differently from the whole chat
    marks_last = TEMPLATE.replace(
        "{% endfor %}{% if add", "{% if loop.last %}!{% endif %}{% endfor %}{% if add"
    )
    with pytest.raises(DatasetError, match=r"row 0.*renders the first 3 messages differently"):
        dataset(write(tmp_path, [{"messages": CHAT}], "chat.parquet"), template=marks_last)[0]
