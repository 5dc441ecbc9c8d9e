"""The prompts a generation call gets, taken out of a training or validation batch."""

from __future__ import annotations

from verl.protocol import DataProto

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


def pop_prompts(batch: DataProto, row_columns: bool) -> DataProto:
    """Remove the left-padded prompt tensors from ``batch`` (the generation brings back
    ``input_ids`` etc. over prompt + response) and return them; with ``row_columns`` the prompts
    also carry the batch's non-tensor columns (``raw_prompt``, ``extra_info``, ``agent_name``:
    what agent loops read), shared, not copied."""
    prompts = batch.pop(batch_keys=PROMPT_KEYS)
    if row_columns:
        prompts.non_tensor_batch = dict(batch.non_tensor_batch)
    return prompts
