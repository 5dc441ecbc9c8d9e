"""A mixture-of-experts policy trained by the Megatron engine with expert parallelism, end to end:
a tiny Qwen3-MoE (4 experts, top 2) on the built-in task, its experts split over 2 ranks
(``expert_model_parallel_size=2``), GRPO steps through ``RayPPOTrainer`` with the hf rollout; every
weight sync (experts gathered from both ranks into transformers' fused tensors) passes its probe, and
the router's load-balancing loss is logged. Real megatron-core over gloo behind the test-only CPU shim
(tests/megatron/worker_plugin.py)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.example_scripts import REPO
from tests.megatron.ranks import run_ranks
from tests.megatron.worker_plugin import OVERRIDES as SHIM
from tests.trainer.fit import fit_trainer
from tests.trainer.test_vllm_learning import needs_vllm
from tests.trainer.verl_lines import script_args, script_steps, swapped
from verl.config.ppo_trainer import load_config

STEPS = 2
SCRIPTS = REPO / "tests/trainer/config/verl_scripts/megatron_moe"
QWEN3_MOE_SCRIPT = SCRIPTS / "grpo_qwen3moe_30b.sh"
QWEN1_5_MOE_SCRIPT = SCRIPTS / "ppo_qwen1.5_moe_a2.7b_gsm8k.sh"


def write_tiny_moe(folder: str, family: str = "qwen3_moe") -> str:
    """A randomly initialised Qwen3-MoE, or a Qwen2-MoE (a gated shared expert; layer 1 dense), with the
    built-in task's tokenizer (head_dim 32: vLLM's CPU attention has no kernel for 16)."""
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig, Qwen3MoeConfig

    from verl.builtin.task import build_char_tokenizer
    from verl.utils.model import save_hf_files

    tokenizer = build_char_tokenizer()
    shared = dict(
        vocab_size=len(tokenizer),
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if family == "qwen3_moe":
        config = Qwen3MoeConfig(**shared, hidden_size=64, head_dim=32)
    else:
        config = Qwen2MoeConfig(
            **shared,
            hidden_size=128,
            shared_expert_intermediate_size=48,
            intermediate_size=64,
            mlp_only_layers=[1],
        )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # decisive routing: at the default init, near-ties flip between kernels
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):  # a MoE layer (a dense one has gate_proj)
                layer.mlp.gate.weight.normal_(0.0, 0.5)
    save_hf_files(model, tokenizer, folder, state_dict=model.state_dict())
    return folder


def run_moe(tmp_path, monkeypatch, name: str, *overrides: str) -> list[dict]:
    """``STEPS`` GRPO steps of the tiny MoE with its experts split over 2 ranks; the metrics rows."""
    model = write_tiny_moe(str(tmp_path / "tiny_moe"))
    monkeypatch.chdir(tmp_path)
    config = load_config(
        [
            *SHIM,
            f"actor_rollout_ref.model.path={model}",
            "preset=embedded",  # a tiny model of its own: the embedded default's CPU sizes
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
            "trainer.n_gpus_per_node=2",
            "trainer.cpus_per_worker=1",
            f"trainer.total_training_steps={STEPS}",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
            "trainer.save_freq=-1",
            "trainer.logger=[file]",
            "trainer.project_name=megatron",
            f"trainer.experiment_name={name}",
            *overrides,
        ]
    )
    fit_trainer(config)
    return [json.loads(line) for line in (tmp_path / f"logs/megatron/{name}/metrics.jsonl").open()]


def probe_gaps(rows: list[dict]) -> list[float]:
    return [row["rollout/weight_sync_probe_gap"] for row in rows if "rollout/weight_sync_probe_gap" in row]


@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_a_moe_policy_trains_with_expert_parallel_megatron(tmp_path, monkeypatch):
    rows = run_moe(
        tmp_path,
        monkeypatch,
        "moe",
        "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_load_balancing_type=aux_loss",
        "actor_rollout_ref.actor.use_kl_loss=True",  # the reference runs on the same expert split
    )
    gaps = probe_gaps(rows)
    assert len(gaps) == STEPS and max(gaps) < 1e-3, gaps  # the experts reached the rollout intact
    aux = [value for row in rows for key, value in row.items() if key.endswith("moe_load_balancing_loss")]
    assert aux and all(0.5 < value < 4.0 for value in aux), aux  # E * sum(f * P): 1 when balanced


@needs_vllm
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_expert_parallel_megatron_syncs_a_moe_into_vllm(tmp_path, monkeypatch):
    """vLLM's CPU build serves the MoE (its fused-experts kernel); after each step the experts
    gathered from both ranks load into it in transformers' fused layout, and its log-probs of what it
    sampled equal the trainer's."""
    rows = run_moe(
        tmp_path,
        monkeypatch,
        "moe_vllm",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    )
    gaps = probe_gaps(rows)
    assert len(gaps) == STEPS and max(gaps) < 1e-3, gaps
    diffs = [
        row["training/rollout_logprob_diff_max"] for row in rows if "training/rollout_logprob_diff_max" in row
    ]
    assert diffs and max(diffs) < 1e-3, diffs


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_verls_qwen3_moe_megatron_line_trains_a_step(builtin_assets, tmp_path, monkeypatch):
    """verl's Qwen3-30B-A3B Megatron line as its script writes it (every offload, Transformer Engine
    fusions, DeepEP, the CPU-offloaded precision-aware optimizer, DAPO's overlong reward): only the
    model (a tiny Qwen3-MoE), the data, the sizes (expert parallel 8 -> 2, rollout TP 4 -> 1, hf
    rollout) and the devices are swapped. The fused-kernel knobs fall back to the local layer spec with
    a warning each, and a GRPO step trains."""
    from verl.trainer.main_ppo import run_ppo

    model = write_tiny_moe(str(tmp_path / "tiny_moe"))
    monkeypatch.chdir(tmp_path)
    args = script_args(QWEN3_MOE_SCRIPT)
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--config-name")).removesuffix(".yaml")
    verl_line = "\n".join(a for a in args if not a.startswith("--"))
    data = str(Path(builtin_assets["train"]).parent)
    sizes = [
        f"actor_rollout_ref.{role}.megatron.expert_model_parallel_size=2" for role in ("actor", "ref")
    ] + [
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "reward_model.reward_kwargs.overlong_buffer_cfg.len=2",  # within the swapped 4-token responses
        "reward_model.reward_kwargs.max_resp_len=4",
    ]
    overrides = [*swapped(verl_line, model, data), *sizes, *SHIM]
    config = load_config(overrides, config_name=name)
    actor = config.actor_rollout_ref.actor
    assert actor.megatron.param_offload and actor.megatron.optimizer_offload  # the script's, kept
    assert actor.optim.override_optimizer_config["optimizer_cpu_offload"]
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 1
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert math.isfinite(metrics[key]), (key, metrics.get(key))


def run_script(rank, world, argv):
    """``python <argv[0]> <argv[1:]>`` in a spawned rank (with the CPU shim): the script's ``main``."""
    spec = importlib.util.spec_from_file_location("verl_line_tool", REPO / argv[0])
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(argv[1:])


@needs_vllm
@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_verls_qwen1_5_moe_ppo_line_converts_then_trains_into_vllm(builtin_assets, tmp_path, monkeypatch):
    """verl's Qwen1.5-MoE PPO line, both of its steps: the converter writes a tiny Qwen2-MoE (a gated
    shared expert, one dense layer) as a distributed checkpoint; then actor, reference and the GAE
    critic (a MoE critic) start from it with pipeline parallel 2 (the script's), and vLLM's CPU engine
    serves the rollout. Swapped: model, checkpoint and data paths, sizes, TP 4 -> 1 (MoE under tensor
    parallelism is refused here), 4 nodes -> 1, vLLM TP 4 -> 1."""
    from verl.trainer.main_ppo import run_ppo

    model = write_tiny_moe(str(tmp_path / "tiny_moe"), "qwen2_moe")
    ckpt = str(tmp_path / "mcore")
    monkeypatch.chdir(tmp_path)
    tool, args = script_steps(QWEN1_5_MOE_SCRIPT)
    assert tool[0] == "scripts/converter_hf_to_mcore.py"
    paths = {"--hf_model_path": model, "--output_path": ckpt}
    run_ranks(run_script, 1, [paths.get(before, arg) for before, arg in zip(["", *tool], tool)])
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--config-name")).removesuffix(".yaml")
    verl_line = "\n".join(a for a in args if not a.startswith("--"))
    roles = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
    sizes = [
        *(f"{role}.megatron.tensor_model_parallel_size=1" for role in roles),
        *(f"{role}.megatron.dist_checkpointing_path={ckpt}" for role in roles),
        "trainer.nnodes=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
    ]
    data = str(Path(builtin_assets["train"]).parent)
    overrides = [*swapped(verl_line, model, data), *sizes, *SHIM]
    config = load_config(overrides, config_name=name)
    assert (
        config.critic.megatron.use_dist_checkpointing
        and config.critic.megatron.pipeline_model_parallel_size == 2
    )
    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 1
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
        assert math.isfinite(metrics[key]), (key, metrics.get(key))
    assert metrics["rollout/weight_sync_probe_gap"] < 1e-3  # the experts and shared expert reached vLLM
    assert metrics["training/rollout_logprob_diff_max"] < 1e-3
