"""``fsdp_config.mixed_precision.cpu_autocast``: on CPU the engine computes forward and backward in
``param_dtype`` under ``torch.autocast`` while weights, gradients and optimizer state stay fp32;
off (the default), CPU stays fp32 and the ``hf`` rollout's log-probs equal the trainer's."""

from __future__ import annotations

import pytest
import torch

from verl.config.base import ConfigError
from verl.config.engine import FSDPConfig, MixedPrecisionConfig, OptimConfig
from verl.config.notes import log_config_notes
from verl.config.ppo_trainer import load_config
from verl.workers.engine.fsdp import FSDPEngine
from verl.workers.rollout.base import engine_dtype

from .rollout.test_hf_rollout import PROMPTS, prompt_batch
from .test_packing import _start, one_update

A = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
R = "actor_rollout_ref.ref.fsdp_config.mixed_precision"
RM = "reward_model.model.fsdp_config.mixed_precision"


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def _engine(cpu_autocast: bool) -> FSDPEngine:
    fsdp = FSDPConfig(mixed_precision=MixedPrecisionConfig(cpu_autocast=cpu_autocast))
    return FSDPEngine(_mlp(), torch.device("cpu"), fsdp, optim=OptimConfig(lr=0.1))


def _x() -> dict[str, torch.Tensor]:
    return {"x": torch.randn(8, 16, generator=torch.Generator().manual_seed(1))}


def test_cpu_autocast_computes_in_bf16_and_trains_fp32_weights():
    engine = _engine(cpu_autocast=True)
    assert engine.compute_dtype == torch.bfloat16
    seen: list[torch.dtype] = []

    def forward_fn(module, micro):
        out = module(micro["x"])
        seen.append(out.dtype)
        return {"y": out}

    got = engine.infer([_x()], forward_fn)[0]["y"]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = _mlp()(_x()["x"]).float()
    with torch.no_grad():
        fp32 = _mlp()(_x()["x"])
    assert seen == [torch.bfloat16]
    assert torch.equal(got, expected)
    assert not torch.equal(got, fp32)  # bf16 products round: a silent no-op would give the fp32 result
    assert torch.allclose(got, fp32, atol=5e-2)

    before = [p.detach().clone() for p in engine.module.parameters()]

    def loss_fn(module, micro):
        out = module(micro["x"])
        seen.append(out.dtype)
        loss = out.float().pow(2).mean()
        return loss, {"loss": float(loss)}

    metrics = engine.train_step([_x()], loss_fn, [1.0])
    assert seen[-1] == torch.bfloat16 and metrics["update_skipped"] == 0.0
    for old, p in zip(before, engine.module.parameters()):
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        assert not torch.equal(old, p)
    state = engine.optimizer.state[next(engine.module.parameters())]
    assert state["exp_avg"].dtype == torch.float32


def test_cpu_stays_fp32_by_default():
    engine = _engine(cpu_autocast=False)
    assert engine.compute_dtype == torch.float32
    got = engine.infer([_x()], lambda m, b: {"y": m(b["x"])})[0]["y"]
    with torch.no_grad():
        assert torch.equal(got, _mlp()(_x()["x"]))


def test_cpu_autocast_needs_bf16():
    with pytest.raises(ConfigError, match=rf"{A}\.param_dtype: expected bf16 with cpu_autocast=True"):
        load_config([f"{A}.cpu_autocast=True", f"{A}.param_dtype=fp32"])


ROLLOUT = "actor_rollout_ref.rollout"


def _noted(device: str, overrides: list[str]) -> set[str]:
    notes = log_config_notes(load_config(overrides), device, overrides)
    return {o.split("=")[0] for o in overrides if any(o.split("=")[0] in note for note in notes)}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_which_dtype_keys_take_effect_on_each_device(device):
    chosen = [
        f"{A}.cpu_autocast=True",
        f"{A}.param_dtype=bf16",
        f"{A}.reduce_dtype=fp32",
        f"{R}.param_dtype=bf16",
        f"{ROLLOUT}.use_dtype_on_cpu=True",
        f"{ROLLOUT}.dtype=bfloat16",
        "reward_model.enable=True",
        "data.return_raw_chat=True",
        f"{RM}.reduce_dtype=fp32",
    ]
    if device == "cpu":  # the actor autocasts to its param_dtype and the rollout runs in its dtype;
        # the reference computes in fp32
        assert _noted(device, chosen) == {f"{A}.reduce_dtype", f"{R}.param_dtype", f"{RM}.reduce_dtype"}
        assert _noted(device, [f"{ROLLOUT}.dtype=bfloat16"]) == {f"{ROLLOUT}.dtype"}
    else:
        assert _noted(device, chosen) == {f"{A}.cpu_autocast", f"{ROLLOUT}.use_dtype_on_cpu"}


def test_rollout_dtype_is_checked():
    with pytest.raises(ConfigError, match=rf"{ROLLOUT}\.dtype: expected one of"):
        load_config([f"{ROLLOUT}.dtype=bfloat61"])
    rollout = load_config([f"{ROLLOUT}.dtype=bf16"]).actor_rollout_ref.rollout
    assert (engine_dtype(rollout, "cuda"), engine_dtype(rollout, "cpu")) == ("bfloat16", "float32")


# ---------------------------------------------------------------------------- through the worker
def _policy_step(monkeypatch, builtin_assets, overrides: list[str]):
    """Old and reference log-probs, one update, then a weight sync with its probe."""
    worker, config = _start(
        monkeypatch,
        [
            f"actor_rollout_ref.model.path={builtin_assets['model']}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            *overrides,
        ],
        "actor_rollout_ref",
    )
    try:
        batch, metrics = one_update(worker, config)
        sync = worker.update_weights(1)
        weights = {p.dtype for p in worker.actor.module.parameters()}
        attention = {
            worker.actor.module.config._attn_implementation,
            worker.ref.module.config._attn_implementation,
        }
        return batch, metrics, sync, (weights, attention)
    finally:
        torch.distributed.destroy_process_group()


def test_the_policy_worker_autocasts_actor_and_reference(monkeypatch, builtin_assets):
    fp32, fp32_metrics, fp32_sync, (_, fp32_attention) = _policy_step(monkeypatch, builtin_assets, [])
    bf16, bf16_metrics, bf16_sync, (weights, attention) = _policy_step(
        monkeypatch, builtin_assets, [f"{A}.cpu_autocast=True", f"{R}.cpu_autocast=True"]
    )
    real = fp32.batch["response_mask"].bool()
    for key in ("old_log_probs", "ref_log_prob"):
        gap = (bf16.batch[key] - fp32.batch[key])[real].abs()
        assert 0 < gap.max() < 0.5 and gap.mean() < 0.05, key
    assert weights == {torch.float32}
    assert fp32_attention == {"sdpa"} and attention == {"verl_cpu"}  # cpu_attention.default_attention
    assert bf16_metrics["actor/pg_loss"] == pytest.approx(fp32_metrics["actor/pg_loss"], abs=0.05)
    assert bf16_metrics["actor/grad_norm"] > 0
    # the probe: fp32 trainer and fp32 hf rollout agree exactly; a bf16 trainer within bf16's tolerance
    assert fp32_sync["rollout/weight_sync_probe_gap"] == 0.0
    assert 1e-4 < bf16_sync["rollout/weight_sync_probe_gap"] < 0.15


@pytest.mark.usefixtures("builtin_assets")
def test_the_sft_trainer_autocasts_through_its_engine_key(tmp_path, monkeypatch):
    from tests.trainer.test_sft_trainer import sft_config
    from verl.trainer.sft_trainer import run_sft

    streams = {}
    for autocast in (False, True):
        workdir = tmp_path / str(autocast)
        workdir.mkdir()
        monkeypatch.chdir(workdir)
        config = sft_config(
            workdir, "trainer.total_training_steps=3", f"engine.mixed_precision.cpu_autocast={autocast}"
        )
        streams[autocast] = run_sft(config)
    fp32, bf16 = streams[False], streams[True]
    loss = next(key for key in fp32 if key.endswith("loss") and key.startswith("train"))
    assert bf16[loss] != fp32[loss]  # bf16 products round differently
    assert bf16[loss] == pytest.approx(fp32[loss], rel=2e-2)


def test_the_hf_rollout_generates_in_rollout_dtype_with_use_dtype_on_cpu(monkeypatch, builtin_assets):
    worker, config = _start(
        monkeypatch,
        [
            f"actor_rollout_ref.model.path={builtin_assets['model']}",
            "actor_rollout_ref.rollout.use_dtype_on_cpu=True",
        ],
        "actor_rollout_ref",
    )
    try:
        assert {p.dtype for p in worker.rollout.module.parameters()} == {torch.bfloat16}
        assert {p.dtype for p in worker.actor.module.parameters()} == {torch.float32}
        prompts = prompt_batch(worker.tokenizer, PROMPTS)
        out = worker.generate_sequences(prompts)
        sync = worker.update_weights(1)  # fp32 weights copied into the bf16 copy, then probed
    finally:
        torch.distributed.destroy_process_group()
    assert out.batch["responses"].shape == (len(prompts), config.actor_rollout_ref.rollout.response_length)
    assert out.batch["response_mask"].sum() > 0
    assert 1e-4 < sync["rollout/weight_sync_probe_gap"] < 0.15
