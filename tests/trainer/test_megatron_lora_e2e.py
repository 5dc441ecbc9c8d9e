"""LoRA GRPO on the Megatron engine (tensor parallel 2 over gloo, the embedded default task, hf
rollout): two steps whose weight syncs (adapters folded into the weights) pass the probe, the
reference is the base model (zero KL at the first step), and the checkpoint's shards merge into the
same weights as peft folds the saved adapter into the base model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("peft")

from tests.example_scripts import REPO
from tests.megatron.worker_plugin import OVERRIDES as SHIM
from tests.trainer.fit import fit_trainer
from tests.trainer.test_vllm_learning import needs_vllm
from tests.trainer.verl_lines import script_args, swapped
from verl.config.ppo_trainer import load_config

STEPS = 2


def peft_merged(base_path: str, adapter_dir) -> dict[str, torch.Tensor]:
    """The base model with the saved adapter folded in by peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().state_dict()


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_megatron_lora_grpo_syncs_merged_weights_and_merges_its_checkpoint(tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from verl.model_merger.megatron import merge_megatron_checkpoint

    monkeypatch.chdir(tmp_path)
    config = load_config(
        [
            *SHIM,
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.model.lora_rank=4",
            "actor_rollout_ref.model.lora_alpha=8",
            "actor_rollout_ref.actor.optim.lr=3e-3",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "trainer.n_gpus_per_node=2",
            "trainer.cpus_per_worker=1",
            f"trainer.total_training_steps={STEPS}",
            f"trainer.save_freq={STEPS}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            "trainer.logger=[file]",
            "trainer.project_name=megatron",
            "trainer.experiment_name=lora",
        ]
    )
    fit_trainer(config)
    rows = [json.loads(line) for line in (tmp_path / "logs/megatron/lora/metrics.jsonl").open()]
    gaps = [row["rollout/weight_sync_probe_gap"] for row in rows if "rollout/weight_sync_probe_gap" in row]
    assert len(gaps) == STEPS and max(gaps) < 1e-3, gaps
    losses = [row["actor/pg_loss"] for row in rows if "actor/pg_loss" in row]
    assert len(losses) == STEPS and all(torch.isfinite(torch.tensor(losses))), losses
    kl = [row["actor/kl_loss"] for row in rows if "actor/kl_loss" in row]
    assert abs(kl[0]) < 1e-6 < max(abs(k) for k in kl[1:]), kl  # reference = base = policy at step 1

    actor = tmp_path / "ckpt" / f"global_step_{STEPS}" / "actor"
    adapter = actor / "huggingface" / "lora_adapter"
    assert (adapter / "adapter_config.json").is_file()
    target = merge_megatron_checkpoint(str(actor), str(tmp_path / "merged"))
    merged = load_file(f"{target}/model.safetensors")
    want = peft_merged(config.actor_rollout_ref.model.path, adapter)
    assert merged.keys() <= want.keys()
    gap = max(float((want[name] - tensor).abs().max()) for name, tensor in merged.items())
    assert gap < 1e-5, gap
    base = AutoModelForCausalLM.from_pretrained(config.actor_rollout_ref.model.path).state_dict()
    moved = max(float((base[name] - tensor).abs().max()) for name, tensor in merged.items())
    assert moved > 1e-4, moved  # the adapters trained and were folded in
    print(f"megatron lora e2e: probe gaps {gaps}, kl {kl}, merged vs peft {gap:.2e}")


VERL_LORA_SCRIPT = REPO / "tests/trainer/config/verl_scripts/megatron_lora/grpo_qwen2_7b_math_lora.sh"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_verls_megatron_lora_line_trains_a_step(builtin_assets, tmp_path, monkeypatch):
    """verl's run_qwen2-7b_math_megatron_lora.sh (LoRA rank 256, alpha 512, kaiming A, mbridge keys,
    full recompute) as its script writes it: only the model, data, sizes (TP 4 -> 2 for two CPU ranks)
    and the rollout (hf) are swapped; its nested ``model.lora.*`` keys become LoRA on the Megatron
    engine (B at zero: the first step's policy is the base model, the reference) and a GRPO step trains."""
    from verl.trainer.main_ppo import run_ppo

    monkeypatch.chdir(tmp_path)
    args = script_args(VERL_LORA_SCRIPT)
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--config-name")).removesuffix(".yaml")
    verl_line = "\n".join(a for a in args if not a.startswith("--"))
    data = str(Path(builtin_assets["train"]).parent)
    sizes = [
        *(f"actor_rollout_ref.{role}.megatron.tensor_model_parallel_size=2" for role in ("actor", "ref")),
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    ]
    overrides = [*swapped(verl_line, builtin_assets["model"], data), *sizes, *SHIM]
    config = load_config(overrides, config_name=name)
    model = config.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, config.actor_rollout_ref.actor.strategy) == (
        256,
        512,
        "megatron",
    )
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 1
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
        assert math.isfinite(metrics[key]), (key, metrics.get(key))
    assert abs(metrics["actor/kl_loss"]) < 1e-6  # B starts at zero: the policy is the base, the reference


@needs_vllm
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_megatron_lora_syncs_only_the_adapters_into_vllm_and_the_engine_runs_them(tmp_path, monkeypatch):
    """The FSDP LoRA example's CPU line on the Megatron engine (TP=2) with vLLM's CPU engine, which
    serves the adapter: every sync carries the peft-named adapters alone (their bytes, not the
    model's; q, k and v sharing their layer's A), and the engine's log-probs of its samples equal the
    trainer's."""
    from tests.example_scripts import script_command
    from verl.utils.model import load_causal_lm
    from verl.workers.engine.lora import apply_lora

    _, overrides = script_command(REPO / "examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_grpo_lora.sh", "cpu")
    run = [
        *SHIM,
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "trainer.n_gpus_per_node=2",
        "trainer.cpus_per_worker=1",
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=-1",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "trainer.logger=[file]",
        "trainer.project_name=megatron",
        "trainer.experiment_name=lora_vllm",
    ]
    config = load_config([*overrides, *run])
    assert config.actor_rollout_ref.rollout.name == "vllm" and config.actor_rollout_ref.model.lora_rank > 0
    monkeypatch.chdir(tmp_path)
    fit_trainer(config)
    rows = [json.loads(line) for line in (tmp_path / "logs/megatron/lora_vllm/metrics.jsonl").open()]
    model = config.actor_rollout_ref.model
    wrapped = apply_lora(load_causal_lm(model), model)  # peft's adapters for the same targets: the bytes sent
    adapter_mb = sum(p.numel() * p.element_size() for p in wrapped.parameters() if p.requires_grad) / 1e6
    model_mb = sum(p.numel() * p.element_size() for p in wrapped.get_base_model().parameters()) / 1e6
    synced = [row["rollout/weight_sync_mb"] for row in rows if "rollout/weight_sync_mb" in row]
    probe = [row["rollout/weight_sync_probe_gap"] for row in rows if "rollout/weight_sync_probe_gap" in row]
    gaps = [
        row["training/rollout_logprob_diff_max"] for row in rows if "training/rollout_logprob_diff_max" in row
    ]
    assert len(probe) == 2 and max(probe) < 1e-3, probe
    assert len(gaps) == 2 and max(gaps) < 1e-3, gaps
    assert synced == [pytest.approx(adapter_mb)] * 2 and adapter_mb < 0.5 * model_mb, (synced, adapter_mb)
