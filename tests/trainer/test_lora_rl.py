"""LoRA GRPO on the embedded default task (peft adapters on the built-in model): it learns, the
reference is the base model (the actor with its adapters off: zero KL at the first step, since
the adapters start as a no-op), and the checkpoint holds the adapters only."""

from __future__ import annotations

import json

import pytest
import torch.distributed.checkpoint as dcp

from tests.trainer.fit import fit_trainer
from verl.config.ppo_trainer import load_config

ACC = "val-core/arith/acc/mean@1"
STEPS = 32


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_lora_grpo_learns_with_the_base_model_as_reference(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(
        [
            "actor_rollout_ref.model.lora_rank=16",
            "actor_rollout_ref.model.lora_alpha=32",
            "actor_rollout_ref.actor.optim.lr=3e-3",
            "actor_rollout_ref.actor.use_kl_loss=True",
            f"trainer.total_training_steps={STEPS}",
            f"trainer.save_freq={STEPS}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"trainer.test_freq={STEPS}",
            "trainer.logger=[file]",
            "trainer.project_name=lora",
            "trainer.experiment_name=run",
            "data.val_max_samples=200",
        ]
    )
    trainer = fit_trainer(config)
    (_, first), (_, last) = trainer.validator.history[0], trainer.validator.history[-1]
    # measured here: 0.315 -> 0.66 after 32 steps (0.455 after 24)
    assert last[ACC] >= first[ACC] + 0.15, (first[ACC], last[ACC])

    rows = [json.loads(line) for line in (tmp_path / "logs/lora/run/metrics.jsonl").open()]
    kl = [row["actor/kl_loss"] for row in rows if "actor/kl_loss" in row]
    assert len(kl) == STEPS
    assert abs(kl[0]) < 1e-6 < max(kl[1:])  # policy = base = reference until the adapters have trained

    shards = tmp_path / "ckpt" / f"global_step_{STEPS}" / "actor"
    saved = dcp.FileSystemReader(str(shards)).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all(".lora_" in k for k in model_keys if not k.endswith("lm_head.weight")), (
        model_keys[:5]
    )
    assert (shards / "huggingface" / "lora_adapter" / "adapter_config.json").is_file()
