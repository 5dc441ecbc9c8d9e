"""Mistakes that ``main_ppo`` refuses at start-up, in one line naming what to change, before Ray starts
(``verl/trainer/preflight.py``): a distillation teacher folder that does not exist, a teacher with
another tokenizer, and the Megatron engine on a machine without CUDA. Each once took a worker's
traceback 30-180 s later, or trained with no word at all."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.megatron.worker_plugin import OVERRIDES as SHIM
from verl.builtin.task import build_char_tokenizer, tiny_qwen2
from verl.config.base import ConfigError
from verl.config.ppo_trainer import load_config
from verl.trainer.preflight import check_megatron_gpus, check_teachers, megatron_roles
from verl.utils.model import ModelPathError

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG = 120  # seconds: only a hang fails it (a refusal before Ray takes the imports' time, ~5-25 s)
TEACHER = "distillation.teacher_models.teacher_model.model_path"


def main_ppo(*overrides: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m verl.trainer.main_ppo`` with ``overrides``, and the seconds it took."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, "trainer.logger=[console]"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": pythonpath, "HYDRA_FULL_ERROR": "0"},
        capture_output=True,
        text=True,
        timeout=HANG * 2,
    )
    return run, time.monotonic() - start


def refusal(run: subprocess.CompletedProcess) -> str:
    """The one line a refused run prints last; Ray never started."""
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Started a local Ray instance" not in run.stdout + run.stderr
    return run.stderr.strip().splitlines()[-1]


def word_tokenizer(tokens: list[str]):
    """A fast tokenizer with one token per character of ``tokens``, ids in that order."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def write_teacher(folder: Path, rows: int, tokenizer=None) -> str:
    """A tiny Qwen2 with ``rows`` embedding rows and ``tokenizer`` (the student's by default)."""
    tokenizer = tokenizer or build_char_tokenizer()
    shape = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    model = tiny_qwen2(tokenizer, 1, vocab_size=rows, num_key_value_heads=1, **shape)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def distillation(*overrides: str):
    return load_config(list(overrides), config_name="distillation_trainer")


@pytest.mark.usefixtures("builtin_assets")
def test_a_teacher_folder_that_does_not_exist_is_refused_before_ray_starts_naming_its_key(tmp_path):
    """It was reported after 84 s from inside the teacher's worker, as actor_rollout_ref.model.path."""
    run, seconds = main_ppo(
        "--config-name", "distillation_trainer", f"{TEACHER}=/no/such/teacher", cwd=tmp_path
    )
    assert refusal(run) == (
        f"Error in the model: {TEACHER}='/no/such/teacher': the directory /no/such/teacher does not exist "
        "(expected a Hugging Face model directory, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct)"
    )
    assert seconds < HANG


@pytest.mark.usefixtures("builtin_assets")
def test_each_of_several_teachers_is_checked_under_its_own_entry_name(tmp_path):
    teacher = write_teacher(tmp_path / "teacher", rows=15)
    entries = []
    for name, path in (("math", teacher), ("code", "/no/such/code_teacher")):
        entry = f"+distillation.teacher_models.{name}"
        entries += [f"{entry}.key={name}", f"{entry}.model_path={path}", f"{entry}.num_replicas=1"]
        entries += [f"{entry}.inference.tensor_model_parallel_size=1"]
    config = distillation(*entries, "distillation.n_gpus_per_node=2")
    with pytest.raises(ModelPathError, match=r"^distillation\.teacher_models\.code\.model_path="):
        check_teachers(config)


@pytest.mark.usefixtures("builtin_assets")
def test_a_teacher_with_another_tokenizer_is_refused_naming_both_paths_and_sizes(tmp_path):
    """It trained with no note: the teacher scored the student's ids as if they were its own tokens."""
    letters = word_tokenizer(["<pad>", "<eos>", "<unk>", *"abcdefghijklmnopqrstu"])  # 24 tokens, no digits
    teacher = write_teacher(tmp_path / "teacher", rows=24, tokenizer=letters)
    config = distillation(f"{TEACHER}={teacher}")
    with pytest.raises(ConfigError) as refused:
        check_teachers(config)
    student = config.actor_rollout_ref.model.path
    assert str(refused.value) == (
        f"{TEACHER}={teacher!r}: the teacher's tokenizer has 24 tokens and the student's tokenizer "
        f"(actor_rollout_ref.model.path={student!r}) 15, and 12 of the student's have another id or none in "
        "the teacher's ('0': 3 -> None); a teacher scores the student's token ids, so it needs the student's "
        "tokenizer (verl maps no tokens between vocabularies)"
    )


@pytest.mark.usefixtures("builtin_assets")
def test_a_teacher_embedding_without_a_row_for_each_student_token_is_refused(tmp_path):
    teacher = write_teacher(tmp_path / "teacher", rows=10)
    with pytest.raises(ConfigError, match=r"the teacher's embedding has 10 rows for the 15 tokens"):
        check_teachers(distillation(f"{TEACHER}={teacher}"))


@pytest.mark.usefixtures("builtin_assets")
def test_a_teacher_with_more_tokens_over_the_students_ids_is_noted_once(tmp_path, caplog):
    """verl's lines distil Qwen2.5-7B (152064 rows) into Qwen2.5-0.5B (151936) over one tokenizer."""
    more = build_char_tokenizer()
    more.add_tokens(list("abcdefghi"))  # 24 tokens: the student's 15 at their ids, 9 more after them
    teacher = write_teacher(tmp_path / "teacher", rows=24, tokenizer=more)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.preflight"):
        check_teachers(distillation(f"{TEACHER}={teacher}"))
    notes = [r.getMessage() for r in caplog.records if "distillation note" in r.getMessage()]
    assert len(notes) == 1
    assert "has 24 tokens and 24 embedding rows" in notes[0] and ") 15 and 15;" in notes[0]
    caplog.clear()
    same_shape = write_teacher(tmp_path / "same", rows=15)
    with caplog.at_level(logging.WARNING, logger="verl.trainer.preflight"):
        check_teachers(distillation(f"{TEACHER}={same_shape}"))
    assert not caplog.records


MEGATRON_REFUSAL = (
    "Error in the config: actor_rollout_ref.actor.strategy=megatron: the Megatron engine needs an NVIDIA GPU "
    "with CUDA (megatron-core calls CUDA even for CPU tensors), and this machine has none; on CPU use "
    "strategy=fsdp (model_engine=dp)"
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a machine without CUDA")
@pytest.mark.usefixtures("builtin_assets")
def test_megatron_on_a_machine_without_cuda_is_refused_in_one_line_before_ray_starts(tmp_path):
    """It was refused after Ray started and the model was placed (31-175 s), by a multi-line
    WorkerMethodError from the worker."""
    run, seconds = main_ppo("model_engine=megatron", cwd=tmp_path)
    assert refusal(run) == MEGATRON_REFUSAL
    assert seconds < HANG


def test_every_megatron_role_is_named_and_a_cluster_with_gpus_is_not_refused():
    assert megatron_roles(load_config([])) == []
    critic = load_config(["critic.strategy=megatron", "algorithm.adv_estimator=gae"])
    assert megatron_roles(critic) == ["critic"]
    with pytest.raises(ConfigError, match=r"^critic\.strategy=megatron: .* and the Ray cluster has none"):
        check_megatron_gpus(critic, 0, "the Ray cluster")
    check_megatron_gpus(critic, 8, "the Ray cluster")
    with_kl = load_config(["model_engine=megatron", "actor_rollout_ref.actor.use_kl_loss=True"])
    assert megatron_roles(with_kl) == ["actor_rollout_ref.actor", "actor_rollout_ref.ref"]


def test_a_run_whose_model_plugin_runs_megatron_on_cpu_is_left_to_the_workers_check():
    """The tests' CPU shim (tests/megatron/worker_plugin.py) says so with MEGATRON_CORE_ON_CPU."""
    check_megatron_gpus(load_config([*SHIM, "model_engine=megatron"]), 0, "this machine")
