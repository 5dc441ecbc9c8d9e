"""A LoRA policy on a real vLLM engine (the CPU build): the engine loads the base model once and
every weight update carries the adapter alone, swapped in under one LoRA id, also between two
decoding steps of a request in flight (server mode). The engine runs in a Ray actor of its own,
as in ``test_vllm_server.py``, whose host and scenarios this reuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.rollout.test_vllm_server import VLLMServerHost, assert_switched_inside_the_sequence, call

pytestmark = pytest.mark.slow  # a vLLM engine each: the full suite runs these, the inner loop not

RANK = 8
LORA_SCRIPT = (
    Path(__file__).resolve().parents[3] / "examples/grpo_trainer/run_qwen2.5-0.5b_gsm8k_grpo_lora.sh"
)


class LoRAHost(VLLMServerHost):
    """The vLLM server with a LoRA policy, and the peft model it must equal."""

    def __init__(self, model_path: str) -> None:
        from verl.utils.model import load_causal_lm
        from verl.workers.engine.lora import apply_lora

        lora = (f"actor_rollout_ref.model.lora_rank={RANK}", "actor_rollout_ref.model.lora_alpha=16")
        super().__init__(model_path, lora)
        self.policy = apply_lora(load_causal_lm(self.model), self.model).eval()

    def _adapter(self, seed: int) -> dict:
        """A random adapter (``lora_B`` is 0 when fresh: the adapter would be a no-op), set on
        the peft model and returned as the tensors a sync sends."""
        import torch

        from verl.workers.engine.lora import adapter_items

        noise = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.policy.named_parameters():
                if ".lora_" in name:
                    p.copy_(0.3 * torch.randn(p.shape, generator=noise))
        return {k: v.clone() for k, v in adapter_items(self.policy.state_dict().items()).items()}

    def _policy_log_probs(self, ids: list[int]) -> list[float]:
        import torch

        with torch.no_grad():
            logits = self.policy(input_ids=torch.tensor([ids])).logits[0, :-1]
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()

    def sync(self, seed: int) -> dict:
        """Sync a fresh random adapter; the engine's and the peft model's log-probs of a probe,
        and the base model's (adapters off)."""
        import torch

        adapter = self._adapter(seed)
        self.server.update_weights(adapter.items(), self.rollout.version + 1)
        probe = torch.randint(
            3, len(self.tokenizer), (24,), generator=torch.Generator().manual_seed(0)
        ).tolist()
        with self.policy.disable_adapter():
            base = self._policy_log_probs(probe)
        return {
            "engine": self.server.sequence_log_probs(probe).tolist(),
            "policy": self._policy_log_probs(probe),
            "base": base,
            "adapter_keys_are_lora": bool(adapter) and all(".lora_" in k for k in adapter),
            "loras": sorted(self.rollout.llm.llm_engine.list_loras()),
        }

    def adapter_swap_mid_generation(self, before: int, total: int) -> dict:
        first = self._adapter(11)
        self.server.update_weights(first.items(), self.rollout.version + 1)
        return self.swap_mid_generation(before, total, self._adapter(12), self._policy_log_probs)


@pytest.fixture(scope="module")
def host(ray_session, builtin_assets):
    import ray

    actor = ray.remote(num_cpus=0)(LoRAHost).remote(builtin_assets["model"])
    yield actor
    ray.kill(actor)


def test_an_adapter_sync_makes_the_engine_run_the_adapted_policy(host):
    for seed in (1, 2):  # the second sync replaces the first under the same LoRA id
        out = call(host.sync, seed)
        assert out["adapter_keys_are_lora"] and out["loras"] == [1]
        engine, policy, base = (out[k] for k in ("engine", "policy", "base"))
        assert max(abs(a - b) for a, b in zip(engine, policy)) < 1e-4
        assert max(abs(a - b) for a, b in zip(engine, base)) > 0.1  # the adapter is not a no-op


def test_an_adapter_swapped_mid_generation_reaches_the_request_in_flight(host):
    assert_switched_inside_the_sequence(call(host.adapter_swap_mid_generation, 4, 12), 12)


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_lora_grpo_on_vllm_sends_only_the_adapters_and_the_engine_runs_them(tmp_path, monkeypatch):
    """The example script's CPU line, 3 steps: every sync carries the adapters alone (their
    size, not the model's) and the engine's log-probs of its own samples equal the trainer's."""
    import json

    from tests.example_scripts import script_command
    from tests.trainer.fit import fit_trainer
    from verl.config.ppo_trainer import load_config
    from verl.utils.model import load_causal_lm
    from verl.workers.engine.lora import apply_lora

    _, overrides = script_command(LORA_SCRIPT, "cpu")
    run = [
        "trainer.total_training_steps=3",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.save_freq=-1",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "trainer.logger=[file]",
        "trainer.project_name=lora",
        "trainer.experiment_name=vllm",
    ]
    config = load_config([*overrides, *run])
    monkeypatch.chdir(tmp_path)
    fit_trainer(config)
    rows = [json.loads(line) for line in (tmp_path / "logs/lora/vllm/metrics.jsonl").open()]

    model = config.actor_rollout_ref.model
    wrapped = apply_lora(load_causal_lm(model), model)
    adapter_bytes = sum(p.numel() * p.element_size() for p in wrapped.parameters() if p.requires_grad)
    model_bytes = sum(p.numel() * p.element_size() for p in wrapped.get_base_model().parameters())
    synced = [row["rollout/weight_sync_mb"] for row in rows if "rollout/weight_sync_mb" in row]
    assert len(synced) == 3 and synced == [pytest.approx(adapter_bytes / 1e6)] * 3
    assert adapter_bytes < 0.5 * model_bytes
    probe = [row["rollout/weight_sync_probe_gap"] for row in rows if "rollout/weight_sync_probe_gap" in row]
    gaps = [
        row["training/rollout_logprob_diff_max"] for row in rows if "training/rollout_logprob_diff_max" in row
    ]
    assert len(probe) == 3 and max(probe) < 1e-3
    assert len(gaps) == 3 and max(gaps) < 1e-3
    assert max(row["actor/kl_loss"] for row in rows if "actor/kl_loss" in row) > 0  # the adapters trained
