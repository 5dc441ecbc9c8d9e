"""A bad model path fails with a message that names it and says what is wrong."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from verl.builtin.task import build_char_tokenizer, build_tiny_qwen2
from verl.utils.checkpoint_io import CheckpointReadError
from verl.utils.model import ModelPathError, load_causal_lm, load_tokenizer


def model_config(path: str) -> SimpleNamespace:
    return SimpleNamespace(
        path=path, override_config={}, trust_remote_code=False, gguf_file=None, external_lib=None
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny HF model inside a checkpoint layout: global_step_2 is the one being read, step 1 is
    the previous complete checkpoint."""
    root = tmp_path_factory.mktemp("ckpt")
    (root / "global_step_1").mkdir()
    (root / "global_step_1" / "driver.pt").write_bytes(b"x")
    folder = root / "global_step_2" / "actor" / "huggingface"
    tokenizer = build_char_tokenizer()
    build_tiny_qwen2(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("path", ["/nonexistent/model", "~/no/such/model", "./relative-missing"])
def test_a_missing_local_directory_says_so(path):
    with pytest.raises(ModelPathError, match=r"actor_rollout_ref\.model\.path=.*does not exist"):
        load_tokenizer(path)
    with pytest.raises(ModelPathError, match=r"does not exist"):
        load_causal_lm(model_config(path))


def test_the_config_key_is_named(tmp_path):
    with pytest.raises(ModelPathError, match=r"data\.tokenizer='/nonexistent'"):
        load_tokenizer("/nonexistent", key="data.tokenizer")


def test_an_empty_directory_says_what_is_missing(tmp_path):
    with pytest.raises(ModelPathError, match=rf"{tmp_path} has no tokenizer files.*an empty directory"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(ModelPathError, match=rf"{tmp_path} has no config\.json"):
        load_causal_lm(model_config(str(tmp_path)))


def test_a_good_directory_loads(model_dir):
    assert load_causal_lm(model_config(str(model_dir))).config.model_type == "qwen2"
    assert load_tokenizer(str(model_dir)).pad_token_id is not None


def test_a_truncated_safetensors_file_names_the_file_and_the_step_to_resume_from(model_dir, tmp_path):
    import shutil

    broken = tmp_path / "global_step_2" / "actor" / "huggingface"
    shutil.copytree(model_dir, broken)
    shutil.copytree(model_dir.parents[2] / "global_step_1", tmp_path / "global_step_1")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointReadError) as info:
        load_causal_lm(model_config(str(broken)))
    message = str(info.value)
    assert f"cannot read {weights}" in message and "step 2" in message
    assert f"trainer.resume_mode=resume_path trainer.resume_from_path={tmp_path / 'global_step_1'}" in message
