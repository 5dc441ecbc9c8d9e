"""A vision-language micro-batch through the shared forward: the padded and the packed path give the
same log-probs on prompts with 0, 1 and 2 images of different sizes, and the image inputs of each
micro-batch are its own rows' (so any split of the batch gives the same numbers)."""

from __future__ import annotations

import copy

import numpy as np
import torch

from tests.vision.conftest import MIXED_PROMPTS, encode, left_padded
from verl.protocol import DataProto
from verl.workers.engine.micro_batch import split_micro_batches
from verl.workers.forward import POLICY_INPUT_KEYS, response_log_probs
from verl.workers.packing import enable_packing
from verl.workers.rollout.base import response_tensors

RESPONSE_LENGTH = 5


def vision_batch(tokenizer, processor) -> DataProto:
    """Prompts of MIXED_PROMPTS with random responses, in the layout the rollout returns."""
    encoded = [
        encode(tokenizer, processor, text, sizes, seed=10 * i)
        for i, (text, sizes) in enumerate(MIXED_PROMPTS)
    ]
    ids, mask = left_padded([e[0] for e in encoded], tokenizer.pad_token_id)
    positions = torch.stack(
        [processor.position_ids(ids[i], mask[i], vision) for i, (_, vision) in enumerate(encoded)]
    )
    generator = torch.Generator().manual_seed(0)
    responses = torch.randint(3, 15, (len(encoded), RESPONSE_LENGTH), generator=generator)  # digits, + and =
    responses[1, 3:] = tokenizer.pad_token_id  # one response ends early (EOS then pads)
    responses[1, 2] = tokenizer.eos_token_id
    versions = torch.zeros_like(responses)
    tensors = response_tensors(ids, mask, positions, responses, versions, [tokenizer.eos_token_id])
    images = np.empty(len(encoded), dtype=object)
    for i, (_, vision) in enumerate(encoded):
        images[i] = vision
    return DataProto.from_dict(tensors, non_tensors={"multi_modal_inputs": images})


def log_probs(model, data: DataProto, micro_batch_size: int | None, packed: bool) -> torch.Tensor:
    micro_batches, groups = split_micro_batches(data, POLICY_INPUT_KEYS, micro_batch_size)
    with torch.no_grad():
        outs = [response_log_probs(model, micro, 1.0, packed=packed)["log_probs"] for micro in micro_batches]
    assert [len(g) for g in groups] == [len(o) for o in outs]
    return torch.cat(outs)


def test_padded_and_packed_paths_agree_on_mixed_images(vlm_family):
    tokenizer, model, processor = vlm_family
    data = vision_batch(tokenizer, processor)
    assert data.batch["position_ids"].shape[1] == 3  # M-RoPE: [B, 3, L]
    padded = log_probs(model, data, None, packed=False)
    packed_model = enable_packing(copy.deepcopy(model))
    packed = log_probs(packed_model, data, None, packed=True)
    mask = data.batch["response_mask"].bool()
    assert torch.allclose(padded[mask], packed[mask], atol=1e-5), (padded - packed).abs()[mask].max()
    # the images matter: the same tokens without their pictures' features give other numbers
    blank = copy.deepcopy(data)
    for vision in blank.non_tensor_batch["multi_modal_inputs"]:
        if vision:
            vision["pixel_values"] = torch.zeros_like(vision["pixel_values"])
    assert not torch.allclose(log_probs(model, blank, None, packed=False)[mask], padded[mask], atol=1e-3)


def test_any_micro_batch_split_gives_the_same_log_probs(vlm_family):
    tokenizer, model, processor = vlm_family
    data = vision_batch(tokenizer, processor)
    whole = log_probs(model, data, None, packed=False)
    for size in (1, 3):
        split = log_probs(model, data, size, packed=False)
        mask = data.batch["response_mask"].bool()
        assert torch.allclose(whole[mask], split[mask], atol=1e-5), size
