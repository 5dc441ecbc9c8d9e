"""verl's own Megatron example lines (tests/trainer/config/verl_scripts/megatron/: GRPO, and PPO with a
Megatron critic) run a training step on CPU: real megatron-core over gloo behind the test-only CPU shim,
tensor parallel 2 on two ranks. The arguments are the scripts' own, read by running them with printf for
python; only the model, the data, the sizes (pipeline 2 -> 1, for two ranks instead of verl's eight)
and the devices are swapped, and the rollout is the in-process hf one (vLLM's tensor parallelism is
tests/trainer/test_verl_tp_examples.py's point, not this one's)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from tests.megatron.worker_plugin import OVERRIDES as SHIM
from tests.trainer.config.test_megatron_config import SCRIPTS, script_args
from tests.trainer.verl_lines import swapped
from verl.config.ppo_trainer import load_config
from verl.trainer.main_ppo import run_ppo

pytestmark = pytest.mark.slow  # two Megatron ranks per role

TWO_RANKS = [
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
]


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.sh")), ids=lambda p: p.stem)
def test_a_verl_megatron_line_trains_one_step_on_cpu(script, builtin_assets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = script_args(script)
    name = next(a.split("=", 1)[1] for a in args if a.startswith("--config-name")).removesuffix(".yaml")
    verl_line = "\n".join(a for a in args if not a.startswith("--"))
    data = str(Path(builtin_assets["train"]).parent)
    overrides = [*swapped(verl_line, builtin_assets["model"], data), *TWO_RANKS, *SHIM]
    config = load_config(overrides, config_name=name)
    arr = config.actor_rollout_ref
    assert arr.actor.strategy == arr.ref.strategy == "megatron"
    assert arr.actor.megatron.tensor_model_parallel_size == 2
    losses = ["actor/pg_loss"]
    if config.use_critic:  # the PPO line: its critic is a Megatron one too, at the actor's sizes
        assert config.critic.strategy == "megatron"
        assert config.critic.megatron.tensor_model_parallel_size == 2
        losses.append("critic/vf_loss")

    metrics = run_ppo(config, overrides)
    assert metrics["training/global_step"] == 1
    for key in [*losses, "actor/grad_norm"]:
        assert math.isfinite(metrics[key]), (key, metrics.get(key))
    assert any(key.startswith("val-core/") for key in metrics), sorted(metrics)
