"""On-policy distillation (``distillation.*``, verl's keys): the config's rules, the routing of samples
to several teachers, and the built-in preset end to end on Ray: the teacher's worker scores as the
teacher model does, the update's loss is the k3 estimator of the two models' log-probs, and over 20
steps the student's divergence from the teacher falls while its accuracy rises toward the teacher's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from verl.builtin.assets import prepare_ppo_assets
from verl.config.base import ConfigError
from verl.config.distillation import teacher_plan
from verl.config.inert import inert_keys
from verl.config.ppo_trainer import load_config
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.teachers import Teachers
from verl.utils.metric import reduce_metrics

PRESET = "distillation_trainer"
ON = [
    "distillation.enabled=true",
    "distillation.nnodes=1",
    "distillation.teacher_models.teacher_model.model_path=/t",
]


def two_teachers(keys=("a", "b")) -> list[str]:
    out = [*ON, "distillation.n_gpus_per_node=2"]
    for index, key in enumerate(keys):
        entry = f"+distillation.teacher_models.t{index}"
        out += [f"{entry}.key={key}", f"{entry}.model_path=/m{index}", f"{entry}.num_replicas=1"]
        out += [f"{entry}.inference.tensor_model_parallel_size=1"]
    return out


def test_one_teacher_takes_the_pool_and_several_split_it():
    config = load_config([*ON, "distillation.n_gpus_per_node=4"])
    (only,) = teacher_plan(config.distillation)
    assert (only.key, only.model_path, only.processes) == ("default", "/t", 4)
    plan = teacher_plan(load_config(two_teachers()).distillation)  # teacher_model is dropped, as in verl
    assert [(p.key, p.model_path, p.processes) for p in plan] == [("a", "/m0", 1), ("b", "/m1", 1)]


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["distillation.enabled=true"], "distillation.nnodes"),
        ([*ON, "distillation.n_gpus_per_node=3"], "inference.tensor_model_parallel_size"),
        ([*ON, "+distillation.teacher_models.teacher_model.temperature=1"], "teacher_model.temperature"),
        ([*ON, "distillation.distillation_loss.loss_mode=k1"], "distillation.distillation_loss.loss_mode"),
        ([*ON, "distillation.distillation_loss.loss_mode=js"], "distillation.distillation_loss.loss_mode"),
        (two_teachers(("a", "a")), "share a key"),
        ([*two_teachers(), "distillation.n_gpus_per_node=3"], "distillation.teacher_models"),
        (
            [*ON, "distillation.distillation_loss.loss_mode=forward_kl_topk", "model_engine=megatron"],
            "actor_rollout_ref.actor.strategy",
        ),
    ],
    ids=[
        "no-pool",
        "replica-size",
        "unknown-key",
        "k1-supervised",
        "unknown-loss",
        "same-key",
        "unfilled",
        "topk-megatron",
    ],
)
def test_a_bad_distillation_config_is_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides)


def test_the_teachers_engine_settings_are_noted_as_inert():
    overrides = [
        *ON,
        "distillation.n_gpus_per_node=2",
        "distillation.teacher_models.teacher_model.inference.name=vllm",
    ]
    noted = inert_keys(load_config(overrides), "cpu", overrides)
    assert "distillation.teacher_models.teacher_model.inference.name" in noted
    assert not any(key.endswith("n_gpus_per_node") for key in noted)
    off = ["distillation.distillation_loss.topk=8"]
    assert inert_keys(load_config(off), "cpu", off) == ["distillation.distillation_loss.topk"]


class RowScorer:
    """A teacher group's stand-in for the routing test: scores a row by its first token and its name."""

    def __init__(self, offset: float) -> None:
        self.offset, self.calls = offset, []

    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        self.calls.append(len(data))
        first = data.batch["input_ids"][:, :1].float()
        return DataProto.from_dict({"teacher_log_probs": first.expand(-1, 2) + self.offset})


def routed_batch(sources: list[str]) -> DataProto:
    ids = torch.arange(len(sources))[:, None].repeat(1, 3)
    batch = DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": ids,
            "responses": ids[:, 1:],
        }
    )
    batch.non_tensor_batch["data_source"] = np.array(sources, dtype=object)
    return batch


def test_several_teachers_score_their_own_rows_in_the_batchs_order():
    groups = {"gsm8k": RowScorer(100.0), "math": RowScorer(200.0)}
    out = Teachers(groups, "data_source").score(routed_batch(["math", "gsm8k", "math", "gsm8k", "math"]))
    assert out.batch["teacher_log_probs"][:, 0].tolist() == [200.0, 101.0, 202.0, 103.0, 204.0]
    assert (groups["gsm8k"].calls, groups["math"].calls) == ([2], [3])
    with pytest.raises(ValueError, match="no teacher has the key 'code'"):
        Teachers(groups, "data_source").score(routed_batch(["math", "code"]))
    with pytest.raises(KeyError, match="teacher_key='task'"):
        Teachers(groups, "task").score(routed_batch(["math"]))


def direct_response_log_probs(path: str, batch: DataProto) -> torch.Tensor:
    """``[B, R]`` log-probs of the responses by a plain forward of the Hugging Face model at ``path``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    responses = batch.batch["responses"]
    with torch.no_grad():
        logits = model(
            input_ids=batch.batch["input_ids"],
            attention_mask=batch.batch["attention_mask"],
            position_ids=batch.batch["position_ids"],
        ).logits.float()
    log_probs = F.log_softmax(logits[:, -responses.shape[1] - 1 : -1], dim=-1)
    return log_probs.gather(-1, responses[..., None])[..., 0]


def k3_token_mean(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> float:
    delta = (teacher - student).clamp(-20, 20)
    return float((((delta.exp() - delta - 1).clamp(max=10)) * mask).sum() / mask.sum())


@pytest.mark.usefixtures("ray_session")
def test_the_preset_scores_with_the_teacher_and_learns_from_it(tmp_path, monkeypatch):
    run = ["trainer.logger=[file]", "trainer.project_name=distil", "trainer.experiment_name=run"]
    config = load_config(
        [*run, f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=20"], PRESET
    )
    prepare_ppo_assets(config)
    monkeypatch.chdir(tmp_path)  # logs/ (the file logger) goes here
    trainer = RayPPOTrainer(config)
    try:
        trainer.init_workers()
        batch = trainer._repeat_prompts(next(trainer._batches()).batch)
        trainer.global_steps = 1
        batch = trainer._generate(batch, {})
        batch.union(trainer.teachers.score(batch))
        mask = batch.batch["response_mask"]
        teacher = direct_response_log_probs(
            config.distillation.teacher_models["teacher_model"]["model_path"], batch
        )
        assert torch.allclose(batch.batch["teacher_log_probs"] * mask, teacher * mask, atol=1e-5)
        student = direct_response_log_probs(config.actor_rollout_ref.model.path, batch)
        metrics = reduce_metrics(trainer.actor_rollout_wg.update_actor(batch).meta_info["metrics"])
        assert metrics["distillation/loss"] == pytest.approx(k3_token_mean(student, teacher, mask), abs=1e-6)
        trainer.sync_weights()

        trainer.global_steps = 0  # the checked step above was one more update before the run
        trainer.fit()
    finally:
        trainer.close()
    rows = [
        json.loads(line) for line in (tmp_path / "logs/distil/run/metrics.jsonl").read_text().splitlines()
    ]
    losses = [row["distillation/loss"] for row in rows if "distillation/loss" in row]
    accuracy = [metrics["val-core/arith/acc/mean@1"] for _, metrics in trainer.validator.history]
    assert len(losses) == 20
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])  # the divergence from the teacher falls
    assert accuracy[-1] >= accuracy[0] + 0.2, accuracy  # 0.3 toward the teacher's 0.95
