"""A role whose Megatron engine reads a distributed checkpoint builds its Hugging Face module without
the weights: nothing is read from ``model.path`` but the config (and a critic's value head), so a
folder without weight files loads, and the module holds meta tensors only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verl.builtin.task import build_char_tokenizer, build_tiny_qwen2
from verl.utils.model import load_causal_lm, load_value_model
from verl.workers.engine.factory import reads_hf_weights


def model_config(path: str) -> SimpleNamespace:
    return SimpleNamespace(
        path=path, override_config={}, trust_remote_code=False, gguf_file=None, external_lib=None
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A causal LM with its weights, the same folder without them, and a token classifier whose
    checkpoint has a trained ``score`` head (sharded, with an index)."""
    from transformers import AutoModelForTokenClassification

    root = tmp_path_factory.mktemp("weightless")
    tokenizer = build_char_tokenizer()
    lm = build_tiny_qwen2(tokenizer)
    for name in ("lm", "config_only"):
        lm.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    for file in (root / "config_only").glob("*.safetensors"):
        file.unlink()
    torch.manual_seed(7)
    classifier = AutoModelForTokenClassification.from_pretrained(root / "lm", num_labels=1)
    classifier.save_pretrained(root / "classifier", max_shard_size="20KB")
    return {name: str(root / name) for name in ("lm", "config_only", "classifier")}, classifier


def meta_only(module, but: str = "") -> bool:
    return all(t.is_meta for name, t in module.state_dict().items() if not (but and name.startswith(but)))


def test_a_policy_without_weight_files_loads_weightless_and_not_otherwise(folders):
    paths, _ = folders
    with pytest.raises(OSError):
        load_causal_lm(model_config(paths["config_only"]))
    module = load_causal_lm(model_config(paths["config_only"]), weights=False)
    assert meta_only(module) and module.config.model_type == "qwen2"
    full = load_causal_lm(model_config(paths["lm"]))
    assert module.state_dict().keys() == full.state_dict().keys()


def test_a_weightless_critic_draws_its_head_like_transformers_or_reads_a_trained_one(folders):
    paths, classifier = folders
    torch.manual_seed(0)
    critic = load_value_model(model_config(paths["config_only"]), weights=False)
    assert meta_only(critic, but="score.")
    torch.manual_seed(0)
    drawn = torch.empty_like(critic.score.weight).normal_(0.0, critic.config.initializer_range)
    assert torch.equal(critic.score.weight, drawn)
    assert critic.score.bias is None or not critic.score.bias.any()
    trained = load_value_model(model_config(paths["classifier"]), weights=False)
    assert meta_only(trained, but="score.")
    for name, tensor in classifier.score.state_dict().items():
        assert torch.equal(trained.score.state_dict()[name], tensor), name


def test_only_a_megatron_role_with_a_distributed_checkpoint_skips_the_hf_weights():
    def role(strategy, dist):
        return SimpleNamespace(strategy=strategy, megatron=SimpleNamespace(use_dist_checkpointing=dist))

    assert not reads_hf_weights(role("megatron", True))
    assert reads_hf_weights(role("megatron", False))
    assert reads_hf_weights(role("fsdp", True))  # the key belongs to the megatron section
