"""The one way a batch of prompts goes through generation, used by both trainers and validation.

``repeat_prompts`` (uids, ``n`` samples per prompt) -> ``pop_prompts`` (what the rollout gets)
-> the rollout client's ``generate_sequences`` -> ``attach_responses`` (responses back into the
batch, the rollout's metrics out).
"""

from __future__ import annotations

import numpy as np

from verl.protocol import DataProto
from verl.utils.metric import reduce_metrics
from verl.workers.vision import MULTI_MODAL_INPUTS

PROMPT_KEYS = ["input_ids", "attention_mask", "position_ids"]


def repeat_prompts(batch: DataProto, uid_prefix: str, n: int) -> DataProto:
    """Give each prompt the uid ``<uid_prefix>-<row>`` (deterministic, so a resumed or replayed
    step groups its samples the same way) and repeat it ``n`` times, a group's rows side by side."""
    batch.non_tensor_batch["uid"] = np.array([f"{uid_prefix}-{i}" for i in range(len(batch))], dtype=object)
    return batch.repeat(n, interleave=True)


def pop_prompts(batch: DataProto, row_columns: bool) -> DataProto:
    """Remove the left-padded prompt tensors from ``batch`` (the generation brings back
    ``input_ids`` etc. over prompt + response) and return them; with ``row_columns`` the prompts
    also carry the batch's non-tensor columns (``raw_prompt``, ``extra_info``, ``agent_name``:
    what agent loops read), shared, not copied."""
    prompts = batch.pop(batch_keys=PROMPT_KEYS)
    if row_columns:
        prompts.non_tensor_batch = dict(batch.non_tensor_batch)
    elif MULTI_MODAL_INPUTS in batch.non_tensor_batch:  # the images the prompts hold
        prompts.non_tensor_batch[MULTI_MODAL_INPUTS] = batch.non_tensor_batch[MULTI_MODAL_INPUTS]
    return prompts


def attach_responses(batch: DataProto, output: DataProto) -> dict[str, float]:
    """Put the generated sequences back into ``batch`` (in place) and return the rollout's metrics,
    each one number (a worker group reports one value per rank: reduced by the key's name)."""
    metrics = reduce_metrics(output.meta_info.pop("metrics", {}))
    if MULTI_MODAL_INPUTS in output.non_tensor_batch:  # an agent loop's: the prompts' images and its tools'
        batch.non_tensor_batch.pop(MULTI_MODAL_INPUTS, None)
    batch.union(output)
    return metrics
