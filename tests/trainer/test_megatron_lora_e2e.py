"""LoRA GRPO on the Megatron engine (tensor parallel 2 over gloo, the embedded default task, hf
rollout): two steps whose weight syncs (adapters folded into the weights) pass the probe, the
reference is the base model (zero KL at the first step), and the checkpoint's shards merge into the
same weights as peft folds the saved adapter into the base model."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("peft")

from tests.megatron.worker_plugin import OVERRIDES as SHIM
from tests.trainer.fit import fit_trainer
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
