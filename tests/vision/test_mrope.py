"""M-RoPE positions built once per prompt equal the ones transformers' Qwen2-VL computes itself."""

from __future__ import annotations

import torch

from tests.vision.conftest import MIXED_PROMPTS, encode, left_padded
from verl.utils.mrope import model_position_ids, mrope_position_ids


def test_positions_equal_the_models_own_rope_index_on_mixed_images(vlm_family):
    tokenizer, model, processor = vlm_family
    encoded = [
        encode(tokenizer, processor, text, sizes, seed=i) for i, (text, sizes) in enumerate(MIXED_PROMPTS)
    ]
    ids, mask = left_padded([e[0] for e in encoded], tokenizer.pad_token_id)
    grids = torch.cat([e[1]["image_grid_thw"] for e in encoded if e[1]])
    expected, _ = model.model.get_rope_index(
        ids, (ids == processor.image_token_id).int(), image_grid_thw=grids, attention_mask=mask
    )
    for row, (_, vision) in enumerate(encoded):
        grid = vision.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        ours = mrope_position_ids(ids[row], mask[row], grid, processor.image_token_id, processor.merge_size)
        real = mask[row].bool()
        assert torch.equal(ours[:, real], expected[:, row, real]), row
        assert not bool(ours[:, ~real].any())  # pads at 0
    # an image block's three axes differ; a text-only row has the same position on each axis
    with_images = mrope_position_ids(
        ids[2], mask[2], encoded[2][1]["image_grid_thw"], processor.image_token_id, 2
    )
    assert not torch.equal(with_images[1], with_images[2])


def test_model_position_ids_puts_the_axes_first():
    positions = torch.arange(24).view(2, 3, 4)
    assert model_position_ids(positions).shape == (3, 2, 4)
    assert torch.equal(model_position_ids(positions)[1, 0], positions[0, 1])
    flat = torch.arange(8).view(2, 4)
    assert model_position_ids(flat) is flat
