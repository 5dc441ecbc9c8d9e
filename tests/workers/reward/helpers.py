"""Build the DataProto a reward manager receives after generation, by hand."""

import numpy as np
import torch

from verl.protocol import DataProto

PAD, EOS = 0, 1


def make_batch(
    tokenizer, prompts, responses, ground_truths, data_source="t", prompt_len=6, response_len=8, eos=True
):
    """Left-padded prompts, right-padded responses (each followed by EOS when ``eos``)."""
    rows_p, rows_r, masks = [], [], []
    for prompt, response in zip(prompts, responses):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"][-prompt_len:]
        r = (tokenizer(response, add_special_tokens=False)["input_ids"] + ([EOS] if eos else []))[
            :response_len
        ]
        rows_p.append([PAD] * (prompt_len - len(p)) + p)
        rows_r.append(r + [PAD] * (response_len - len(r)))
        masks.append(
            [0] * (prompt_len - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (response_len - len(r))
        )
    responses_t = torch.tensor(rows_r)
    mask = torch.tensor(masks)
    tensors = {
        "prompts": torch.tensor(rows_p),
        "responses": responses_t,
        "attention_mask": mask,
        "response_mask": mask[:, prompt_len:],
    }
    n = len(prompts)
    sources = data_source if isinstance(data_source, list) else [data_source] * n
    non_tensors = {
        "data_source": np.array(sources, dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": g} for g in ground_truths], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
    }
    return DataProto.from_dict(tensors, non_tensors)
