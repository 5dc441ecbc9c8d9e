"""The driver and the policy workers load the same tokenizer, from the same settings."""

from __future__ import annotations

from verl.config.actor import ModelConfig
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.model import load_tokenizer, resolve_tokenizer_source


def test_data_tokenizer_comes_before_the_models_tokenizer_path_and_path():
    model = ModelConfig(path="model", tokenizer_path="tok", gguf_file="m.gguf", trust_remote_code=False)
    source = resolve_tokenizer_source(model, "data_tok", data_trust_remote_code=True)
    assert (source.path, source.key, source.trust_remote_code) == ("data_tok", "data.tokenizer", True)
    assert source.gguf_file is None  # a tokenizer of its own, not the model's GGUF file
    source = resolve_tokenizer_source(model)
    assert (source.path, source.key, source.gguf_file) == (
        "tok",
        "actor_rollout_ref.model.tokenizer_path",
        "m.gguf",
    )
    model.tokenizer_path = None
    assert resolve_tokenizer_source(model).key == "actor_rollout_ref.model.path"


def test_workers_load_the_tokenizer_data_tokenizer_names_like_the_driver(
    ray_session, builtin_assets, tmp_path
):
    tokenizer = load_tokenizer(builtin_assets["model"])
    tokenizer.add_special_tokens({"pad_token": "<extra_pad>"})  # a new pad id, one more token
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    overrides = [
        "trainer.n_gpus_per_node=1",
        "trainer.cpus_per_worker=1",
        "trainer.logger=[console]",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        f"data.tokenizer={tmp_path / 'tokenizer'}",
    ]
    trainer = RayPPOTrainer(load_config(overrides))
    try:
        trainer.init_workers()
        worker = trainer.actor_rollout_wg.tokenizer_info()[0]
    finally:
        trainer.close()
    driver = trainer.tokenizer
    assert (
        driver.pad_token_id == tokenizer.pad_token_id != load_tokenizer(builtin_assets["model"]).pad_token_id
    )
    assert worker == {
        "pad_token_id": driver.pad_token_id,
        "eos_token_id": driver.eos_token_id,
        "vocab_size": len(driver),
    }
