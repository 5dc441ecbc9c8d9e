"""``python -m verl.model_merger merge``: a 2-rank FSDP checkpoint becomes a Hugging Face model
whose logits equal the actor's (as exported from the live actor with ``save_contents: hf_model``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo


@pytest.fixture(scope="module")
def checkpoint(ray_session, builtin_assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    overrides = [
        "trainer.n_gpus_per_node=2",
        "trainer.cpus_per_worker=1",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "trainer.val_before_train=False",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={root}",
        "data.train_batch_size=8",
        "data.val_max_samples=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ]
    run_ppo(load_config(overrides), overrides)
    return root / "global_step_2" / "actor"


def logits(path: str, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_merged_model_reproduces_the_actor(checkpoint, builtin_assets, tmp_path):
    shards = sorted(f for f in os.listdir(checkpoint) if f.endswith(".distcp"))
    assert len(shards) == 2, shards  # one shard per rank
    target = tmp_path / "merged"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.model_merger",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(checkpoint),
            "--target_dir",
            str(target),
        ],
        check=True,
    )
    assert (target / "model.safetensors").exists()
    tokenizer = AutoTokenizer.from_pretrained(target)
    ids = torch.tensor([tokenizer("3+4=7", add_special_tokens=False)["input_ids"]])
    merged = logits(str(target), ids)
    exported = logits(str(checkpoint / "huggingface"), ids)  # gathered from the live actor
    initial = logits(builtin_assets["model"], ids)
    assert torch.equal(merged, exported)
    assert not torch.allclose(merged, initial)  # two updates really changed the weights


def test_merge_errors_name_what_is_missing(checkpoint, tmp_path):
    from verl.model_merger import merge_fsdp_checkpoint

    with pytest.raises(FileNotFoundError, match="global_step_N/actor"):
        merge_fsdp_checkpoint(str(checkpoint.parent), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="--dtype"):
        merge_fsdp_checkpoint(str(checkpoint), str(tmp_path / "out"), dtype="float99")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_resume_on_another_rank_count_is_refused_with_a_way_out(checkpoint):
    root = checkpoint.parent.parent
    overrides = [
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=3",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={root}",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
    ]
    with pytest.raises(ValueError, match=r"written by 2 ranks but this run has 1.*model_merger"):
        run_ppo(load_config(overrides), overrides)
