"""A critic for a vision-language policy: the value model is the policy's vision-language trunk with a
one-output head, and its forward gets each row's images and M-RoPE positions as the actor's does.

Its values on an image batch (0, 1 or 2 images per row, of different sizes) equal transformers' own
trunk (which builds its own positions from the image tokens) followed by the same head, on the padded
and the packed path, for Qwen2-VL, Qwen2.5-VL and Qwen3-VL; and the built-in VLM preset trains with
GAE and that critic."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.vision.conftest import FAMILIES, tiny_family
from tests.vision.test_vision_forward import vision_batch
from verl.builtin.assets import prepare_ppo_assets
from verl.config.critic import CriticModelConfig
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.trainer.ppo.builders import build_tokenizer
from verl.trainer.ppo.dataloaders import build_dataloaders
from verl.utils.model import load_value_model
from verl.workers.engine.micro_batch import split_micro_batches
from verl.workers.forward import POLICY_INPUT_KEYS, response_values
from verl.workers.packing import enable_packing
from verl.workers.vision import MULTI_MODAL_INPUTS, micro_batch_vision


@pytest.fixture(scope="module", params=FAMILIES)
def saved_family(request, tmp_path_factory):
    """(tokenizer, image processor, folder) of a tiny freshly initialised model of each family, saved
    as transformers saves it (Qwen2-VL's checkpoint names: ``model.layers``, ``visual.``)."""
    tokenizer, model, processor = tiny_family(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer, processor, str(folder)


def critic_values(critic, data: DataProto, packed: bool) -> torch.Tensor:
    """Values of every row as the critic worker computes them: micro-batches of two rows, each with
    its own rows' images."""
    micro_batches, _ = split_micro_batches(data, POLICY_INPUT_KEYS, 2)
    with torch.no_grad():
        return torch.cat([response_values(critic, micro, packed) for micro in micro_batches])


def transformers_values(folder: str, head: torch.nn.Module, data: DataProto) -> torch.Tensor:
    """The same values from transformers' vision-language trunk (loaded on its own, positions from
    its own ``get_rope_index``) and ``head``: one forward of the whole batch."""
    from transformers import AutoModelForImageTextToText

    trunk = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).model.eval()
    ids, mask = data.batch["input_ids"], data.batch["attention_mask"]
    vision = micro_batch_vision(data.non_tensor_batch[MULTI_MODAL_INPUTS])
    token_types = (ids == trunk.config.image_token_id).int()
    with torch.no_grad():
        hidden = trunk(input_ids=ids, attention_mask=mask, mm_token_type_ids=token_types, **vision)
        values = head(hidden.last_hidden_state)[..., 0]
    response_length = data.batch["responses"].shape[1]
    return values[:, -response_length - 1 : -1]


def test_vl_critic_values_equal_the_trunk_and_head_padded_and_packed(saved_family):
    tokenizer, processor, folder = saved_family
    data = vision_batch(tokenizer, processor)
    config = CriticModelConfig(path=folder, external_lib=None, gguf_file=None)
    torch.manual_seed(0)
    critic = load_value_model(config).eval()
    assert critic.score.out_features == 1 and not hasattr(critic, "lm_head")
    padded = critic_values(critic, data, packed=False)
    packed = critic_values(enable_packing(copy.deepcopy(critic)), data, packed=True)
    expected = transformers_values(folder, critic.score, data)
    mask = data.batch["response_mask"].bool()
    assert torch.allclose(padded[mask], expected[mask], atol=1e-5), (padded - expected)[mask].abs().max()
    assert torch.allclose(packed[mask], padded[mask], atol=1e-5), (packed - padded)[mask].abs().max()
    # the images matter: the same rows without their pictures' features give other values
    blind = transformers_values(folder, critic.score, _without_image_features(data))
    assert not torch.allclose(blind[mask], expected[mask], atol=1e-3)


def _without_image_features(data: DataProto) -> DataProto:
    """``data`` with each image's pixels zeroed (same shapes and tokens)."""
    rows = copy.deepcopy(data)
    for row in rows.non_tensor_batch[MULTI_MODAL_INPUTS]:
        if row:
            row["pixel_values"] = torch.zeros_like(row["pixel_values"])
    return rows


def test_a_text_critic_for_a_vision_policy_is_refused_by_name():
    text = load_config([])  # the default preset's tiny text model
    prepare_ppo_assets(text)
    overrides = ["algorithm.adv_estimator=gae", f"critic.model.path={text.actor_rollout_ref.model.path}"]
    config = load_config(overrides, "vlm_trainer")
    prepare_ppo_assets(config)
    with pytest.raises(ValueError, match=r"critic\.model\.path="):
        build_dataloaders(config, build_tokenizer(config))


STEPS = 4


@pytest.mark.usefixtures("ray_session")
def test_the_vlm_preset_trains_with_a_gae_critic(tmp_path, monkeypatch):
    from tests.trainer.fit import fit_trainer

    monkeypatch.chdir(tmp_path)
    overrides = [
        "algorithm.adv_estimator=gae",
        "critic.model.use_remove_padding=True",  # the packed path; the actor keeps the padded one
        "critic.optim.lr=1e-3",
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[file]",
        "trainer.project_name=vlm",
        "trainer.experiment_name=gae",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
    config = load_config(overrides, "vlm_trainer")
    prepare_ppo_assets(config)
    fit_trainer(config)
    rows = [json.loads(line) for line in (tmp_path / "logs/vlm/gae/metrics.jsonl").open()]
    losses = [row["critic/vf_loss"] for row in rows]
    assert len(losses) == STEPS and all(loss is not None for loss in losses), losses  # null = not finite
    assert losses[-1] < losses[0], losses
