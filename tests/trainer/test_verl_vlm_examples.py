"""verl's geo3k VLM example lines run a training step on CPU: the data written by
examples/data_preprocess/geo3k.py from a local copy of the dataset's columns, the arguments of
verl's examples/grpo_trainer/run_qwen2_5_vl-7b.sh (and its freeze-vision variant) verbatim with the
engine argument ``hf`` (the script's $1; vLLM's CPU build cannot load Qwen2-VL, see docs/vlm.md), and
the built-in tiny Qwen2-VL, sizes and two CPU ranks swapped in."""

from __future__ import annotations

import random

import pytest
import torch

from tests.examples.test_data_preprocess import run_script
from tests.trainer.verl_lines import swapped
from verl.builtin import task as text_task
from verl.builtin import vision_task
from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo
from verl.utils.dataset.schema import write_parquet
from verl.workers.vision import freeze_vision_tower

# examples/grpo_trainer/run_qwen2_5_vl-7b.sh with ENGINE=hf
GEO3K_QWEN2_5_VL_7B = """
    algorithm.adv_estimator=grpo
    data.train_files=$HOME/data/geo3k/train.parquet
    data.val_files=$HOME/data/geo3k/test.parquet
    data.train_batch_size=512
    data.max_prompt_length=1024
    data.max_response_length=2048
    data.filter_overlong_prompts=True
    data.truncation='error'
    data.image_key=images
    actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.use_fused_kernels=True
    actor_rollout_ref.actor.ppo_mini_batch_size=128
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.01
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.fsdp_config.param_offload=False
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=20
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.name=hf
    +actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.enable_chunked_prefill=False
    actor_rollout_ref.rollout.enforce_eager=False
    actor_rollout_ref.rollout.free_cache_engine=True
    actor_rollout_ref.rollout.n=5
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=20
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    algorithm.use_kl_in_reward=False
    trainer.critic_warmup=0
    trainer.logger='["console","wandb"]'
    trainer.project_name='verl_grpo_example_geo3k'
    trainer.experiment_name='qwen2_5_vl_7b_function_rm'
    trainer.n_gpus_per_node=8
    trainer.nnodes=1
    trainer.save_freq=20
    trainer.test_freq=5
    trainer.total_epochs=15
"""
# examples/grpo_trainer/run_qwen2_5_vl-7b_freeze_vision.sh: the same line, the vision tower frozen
# and without use_fused_kernels
FREEZE_VISION = GEO3K_QWEN2_5_VL_7B.replace(
    "    actor_rollout_ref.model.use_fused_kernels=True\n",
    "    actor_rollout_ref.actor.freeze_vision_tower=True\n",
)
# run_qwen2_5_vl-7b_lora.sh: LoRA on the language model (the vision tower excluded), lr 3e-6
LORA = (
    GEO3K_QWEN2_5_VL_7B.replace("lr=1e-6", "lr=3e-6")
    .replace("    actor_rollout_ref.model.use_fused_kernels=True\n", "")
    .replace("free_cache_engine=True", "free_cache_engine=False")
    .replace(
        "    actor_rollout_ref.actor.ppo_mini_batch_size=128\n",
        "    actor_rollout_ref.actor.ppo_mini_batch_size=128\n"
        "    actor_rollout_ref.model.lora_rank=64\n"
        "    actor_rollout_ref.model.lora_alpha=32\n"
        "    actor_rollout_ref.model.target_modules=all-linear\n"
        "    actor_rollout_ref.model.exclude_modules='.*visual.*'\n",
    )
)
# run_qwen2_5_vl-7b_seq_balance.sh: token-budget micro-batches instead of fixed sizes
SEQ_BALANCE = (
    GEO3K_QWEN2_5_VL_7B.replace("    actor_rollout_ref.model.use_fused_kernels=True\n", "")
    .replace(
        "    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10\n",
        "    actor_rollout_ref.actor.use_dynamic_bsz=True\n    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=6144\n",
    )
    .replace("    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=20\n", "")
    .replace("    +actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True\n", "")
    .replace("free_cache_engine=True", "free_cache_engine=False")
    .replace("ref.log_prob_micro_batch_size_per_gpu=20", "ref.log_prob_max_token_len_per_gpu=6144")
)
EXAMPLES = {
    "grpo_trainer/run_qwen2_5_vl-7b.sh": GEO3K_QWEN2_5_VL_7B,
    "grpo_trainer/run_qwen2_5_vl-7b_freeze_vision.sh": FREEZE_VISION,
    "grpo_trainer/run_qwen2_5_vl-7b_lora.sh": LORA,
    "grpo_trainer/run_qwen2_5_vl-7b_seq_balance.sh": SEQ_BALANCE,
}


@pytest.fixture(scope="module")
def geo3k_data(tmp_path_factory) -> str:
    """examples/data_preprocess/geo3k.py over a local copy of the dataset's columns (digit pictures
    standing in for the diagrams)."""
    raw = tmp_path_factory.mktemp("geometry3k")
    rng = random.Random(0)
    for split, count in (("train", 8), ("test", 4)):
        rows = []
        for _ in range(count):
            digit = rng.randrange(10)
            image = {"bytes": vision_task.digit_image(digit, rng), "path": None}
            rows.append({"problem": "<image>Find x.", "answer": str(digit), "images": [image]})
        write_parquet(rows, raw / f"{split}.parquet")
    out = tmp_path_factory.mktemp("geo3k")
    result = run_script("geo3k.py", "--local_dir", out, "--local_dataset_path", raw)
    assert result.returncode == 0, result.stderr
    return str(out)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_a_verl_vlm_example_trains_one_step_on_cpu(example, geo3k_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = str(vision_task.vision_model_dir())
    vision_task.ensure_vision_model(model)
    overrides = [
        *swapped(EXAMPLES[example], model, geo3k_data),
        "data.max_prompt_length=320",  # verl's instruction, one token per character for the tiny model
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",  # the hf rollout: one engine per rank
    ]
    config = load_config(overrides)
    assert config.data.image_key == "images" and config.actor_rollout_ref.model.use_remove_padding
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 1
    assert metrics["rollout/weight_sync_probe_gap"] < 1e-5
    assert "val-core/hiyouga/geometry3k/acc/mean@1" in metrics, sorted(metrics)


def test_freeze_vision_tower_keeps_the_image_encoder_out_of_training():
    model = vision_task.build_tiny_qwen2_vl(vision_task.build_vision_tokenizer())
    freeze_vision_tower(model)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all(".visual." in f".{name}" for name in frozen)
    assert all(p.requires_grad for name, p in model.named_parameters() if "visual" not in name)
    text = text_task.build_tiny_qwen2(text_task.build_char_tokenizer())
    with pytest.raises(ValueError, match="freeze_vision_tower=True: Qwen2ForCausalLM has no vision tower"):
        freeze_vision_tower(text)
    assert all(p.requires_grad for p in text.parameters()) and torch.is_grad_enabled()
