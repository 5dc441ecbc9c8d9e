"""The SFT trainer for real: the embedded default lowers the validation loss, the loss is the same
token mean whatever the micro-batching or the number of ranks (torchrun, gloo), a run killed with
SIGKILL resumes bit for bit, and an RL run started from its checkpoint learns."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.fit import fit_trainer
from verl.builtin import task as builtin
from verl.config.base import ConfigError
from verl.config.sft_trainer import load_sft_config
from verl.model_merger.fsdp import merge_fsdp_checkpoint
from verl.trainer.sft_trainer import SFTTrainer, run_sft

REPO_ROOT = Path(__file__).resolve().parents[2]
QUIET = ["trainer.logger=[file]", "trainer.project_name=sft", "trainer.experiment_name=run"]


def sft_config(tmp_path: Path, *overrides: str):
    return load_sft_config([f"trainer.default_local_dir={tmp_path / 'ckpt'}", *QUIET, *overrides])


def test_verl_spellings_are_converted_and_bad_keys_named(caplog):
    config = load_sft_config(
        [
            "model.partial_pretrain=/some/model",
            "optim.warmup_steps_ratio=0.1",
            "optim.lr_scheduler=cosine",
            "data.multiturn.messages_key=chat",
            "+data.max_length=32",  # verl scripts add keys with "+": accepted when the schema has them
        ]
    )
    assert config.model.path == "/some/model" and config.model.partial_pretrain is None
    assert config.optim.lr_warmup_steps_ratio == 0.1 and config.optim.lr_scheduler_type == "cosine"
    assert config.data.messages_key == "chat" and config.data.max_length == 32
    with pytest.raises(ConfigError, match=r"model.lora_rank"):
        load_sft_config(["model.lora_rank=-1"])
    with pytest.raises(ConfigError, match=r"data.truncation"):
        load_sft_config(["data.truncation=middle"])
    with pytest.raises(Exception, match=r"no_such_key"):
        load_sft_config(["data.no_such_key=1"])
    with caplog.at_level("WARNING"):
        load_sft_config(["data.num_workers=2", "trainer.n_gpus_per_node=8"])
    notes = [r.getMessage() for r in caplog.records if "has no effect here" in r.getMessage()]
    assert [n.split("=")[0] for n in notes] == [
        "config note: data.num_workers",
        "config note: trainer.n_gpus_per_node",
    ]


@pytest.mark.usefixtures("builtin_assets")
def test_embedded_default_lowers_the_validation_loss(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    metrics = run_sft(sft_config(tmp_path))
    printed = capsys.readouterr().out
    line = next(row for row in printed.splitlines() if row.startswith("validation loss: "))
    losses = [float(v) for v in line.removeprefix("validation loss: ").split(" -> ")]
    assert len(losses) == 4  # before training, then every 10 of the preset's 30 steps
    assert losses[-1] == pytest.approx(metrics["val/loss"], abs=1e-4)
    # measured here: 0.689 -> 0.415; the stated aim is at least 25% lower
    assert losses[-1] <= 0.75 * losses[0], losses
    logged = [
        json.loads(row)
        for row in (tmp_path / "logs" / "sft" / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [row["step"] for row in logged] == list(range(31))


@pytest.mark.usefixtures("builtin_assets")
def test_micro_batching_does_not_change_the_loss(tmp_path):
    """The loss and gradient are the batch's token mean: one micro-batch, eight, or a token budget."""
    runs = {}
    for name, overrides in {
        "one": ["data.use_dynamic_bsz=False", "data.micro_batch_size_per_gpu=64"],
        "eight": ["data.use_dynamic_bsz=False", "data.micro_batch_size_per_gpu=8"],
        "tokens": ["data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=100"],
    }.items():
        config = sft_config(
            tmp_path / name, "data.val_files=null", "trainer.total_training_steps=2", *overrides
        )
        trainer = SFTTrainer(config)
        try:
            runs[name] = [trainer.train_step(next(trainer._batches())) for _ in range(2)]
        finally:
            trainer.close()
    for name in ("eight", "tokens"):
        for ours, base in zip(runs[name], runs["one"]):
            assert ours["train/loss"] == pytest.approx(base["train/loss"], rel=1e-5), name
            assert ours["train/grad_norm"] == pytest.approx(base["train/grad_norm"], rel=1e-4), name
    assert runs["one"][1]["train/loss"] != runs["one"][0]["train/loss"]  # the first step did train


# ---------------------------------------------------------------------------- subprocess runs
def start(
    workdir: Path, args: list[str], env: dict[str, str] | None = None, torchrun: int = 0
) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    pythonpath = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    launcher = [sys.executable, "-m"]
    if torchrun:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={torchrun}",
            "-m",
        ]
    return subprocess.Popen(
        [*launcher, *args],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the run hung for {timeout} s:\n{out[-3000:]}") from None
    return proc.returncode, out


def metric_stream(workdir: Path) -> dict[int, dict[str, float]]:
    """Step -> metrics; a step logged twice (before a crash and after the resume) keeps the last."""
    steps: dict[int, dict[str, float]] = {}
    for line in (workdir / "logs" / "sft" / "run" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps[row.pop("step")] = row
    return steps


def sft_args(workdir: Path, *overrides: str, module: str = "verl.trainer.sft_trainer") -> list[str]:
    return [module, f"trainer.default_local_dir={workdir / 'ckpt'}", *QUIET, *overrides]


def train_here(workdir: Path, run: list[str], monkeypatch) -> dict[int, dict[str, float]]:
    """A run in this process (no start-up of its own) on one thread, as the runs in subprocesses
    (OMP_NUM_THREADS=1); its metric stream."""
    workdir.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(workdir)  # logs/ goes here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_sft(sft_config(workdir, *run))
    finally:
        torch.set_num_threads(threads)
    return metric_stream(workdir)


@pytest.mark.slow
@pytest.mark.usefixtures("builtin_assets")
def test_sigkill_then_resume_is_bit_identical(tmp_path, monkeypatch, caplog):
    """A run in a subprocess SIGKILLs itself after step 5 (the last checkpoint is step 3); started
    again (here: what it reads is what the killed process left on disk), it ends with the metric
    stream of the uninterrupted run."""
    run = [
        "trainer.total_training_steps=8",
        "trainer.save_freq=3",
        "trainer.test_freq=4",
        "data.val_max_samples=64",
    ]
    whole = train_here(tmp_path / "whole", run, monkeypatch)

    crashed = tmp_path / "crashed"
    code, out = finish(start(crashed, sft_args(crashed, *run), env={"VERL_FAULT": "sft_after_step@5"}))
    assert code == -signal.SIGKILL, out[-3000:]
    assert max(metric_stream(crashed)) == 5  # killed after step 5; the last checkpoint is step 3
    with caplog.at_level(logging.INFO, logger="verl.trainer.sft_loop"):
        resumed = train_here(crashed, run, monkeypatch)
    assert "resumed from" in caplog.text and "global_step_3" in caplog.text
    assert resumed == whole  # every metric of every step, bit for bit


@pytest.mark.slow
@pytest.mark.usefixtures("builtin_assets")
@pytest.mark.parametrize("layout", ["lora", "sequence_parallel"])
def test_two_torchrun_ranks_equal_one_rank(tmp_path, builtin_assets, layout, monkeypatch):
    """verl's older entry point and spelling under torchrun (2 CPU ranks, FSDP2 over gloo) gives the
    same losses as one padded process (this one): LoRA adapters with each rank on half the rows, or
    all weights with both ranks on the same packed rows, each sequence split between them (Ulysses).
    The checkpoint it writes exports to a model with the same val loss."""
    run = ["trainer.total_training_steps=3", "trainer.save_freq=3", "data.val_max_samples=64"]
    two_only = []
    if layout == "lora":
        run += ["model.lora_rank=8", "optim.lr=3e-3"]
    else:
        two_only = ["ulysses_sequence_parallel_size=2", "use_remove_padding=true"]  # fsdp_sft_trainer's keys
    (tmp_path / "one").mkdir()
    monkeypatch.chdir(tmp_path / "one")  # logs/ goes here
    run_sft(sft_config(tmp_path / "one", *run))
    two, cache = tmp_path / "two", tmp_path / "cache"
    model = cache / "models" / builtin.BUILTIN_MODEL_NAME
    if layout == "lora":
        # the ranks start on an empty cache: rank 0 builds the built-in model (its warm-up trains alone,
        # before the ranks join) and the chats; both equal the ones the run above used
        env = {"VERL_CACHE_DIR": str(cache)}
    else:
        env, model = {}, Path(builtin_assets["model"])
    args = sft_args(
        two, *run, *two_only, f"model.partial_pretrain={model}", module="verl.trainer.fsdp_sft_trainer"
    )
    code, out = finish(start(two, args, env=env, torchrun=2))
    assert code == 0, out[-3000:]
    if layout == "lora":
        built = (model / "model.safetensors").read_bytes()
        assert built == (Path(builtin_assets["model"]) / "model.safetensors").read_bytes()
    else:
        assert "converted ulysses_sequence_parallel_size -> engine.ulysses_sequence_parallel_size" in out
    one_stream, two_stream = metric_stream(tmp_path / "one"), metric_stream(two)
    assert sorted(one_stream) == sorted(two_stream) == [0, 1, 2, 3]
    for step in one_stream:
        for key, value in one_stream[step].items():
            assert two_stream[step][key] == pytest.approx(value, rel=2e-5, abs=1e-6), (step, key)
    shards = sorted(p.name for p in (two / "ckpt" / "global_step_3" / "model").glob("worker_rank_*.pt"))
    assert shards == ["worker_rank_0.pt", "worker_rank_1.pt"]

    merged = merge_fsdp_checkpoint(str(two / "ckpt" / "global_step_3" / "model"), str(tmp_path / "merged"))
    config = sft_config(tmp_path / "check", f"model.path={merged}", "data.val_max_samples=64")
    trainer = SFTTrainer(config)
    try:
        assert trainer.validate()["val/loss"] == pytest.approx(two_stream[3]["val/loss"], rel=1e-5)
    finally:
        trainer.close()


SFT_STEPS = 10  # a short SFT leaves room to learn: 30 steps reach 0.78 greedy accuracy already
RL_STEPS = 32
ACC = "val-core/arith/acc/mean@1"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session", "builtin_assets")
def test_rl_from_the_sft_checkpoint_learns(tmp_path, monkeypatch):
    """SFT writes a loadable model into its checkpoint (``hf_model``); GRPO started from it raises the
    greedy accuracy."""
    from verl.config.ppo_trainer import load_config

    monkeypatch.chdir(tmp_path)
    sft = [f"trainer.total_training_steps={SFT_STEPS}", f"trainer.save_freq={SFT_STEPS}"]
    run_sft(sft_config(tmp_path, *sft, "checkpoint.save_contents=[model,optimizer,extra,hf_model]"))
    model = tmp_path / "ckpt" / f"global_step_{SFT_STEPS}" / "model" / "huggingface"
    assert (model / "model.safetensors").is_file()
    config = load_config(
        [
            f"actor_rollout_ref.model.path={model}",
            "preset=embedded",  # the SFT'd tiny model: the embedded default's CPU sizes
            f"trainer.total_training_steps={RL_STEPS}",
            f"trainer.test_freq={RL_STEPS}",
            "trainer.logger=[file]",
            "trainer.project_name=rl",
            "trainer.experiment_name=run",
            "data.val_max_samples=200",
        ]
    )
    trainer = fit_trainer(config)
    rows = [json.loads(row) for row in (tmp_path / "logs/rl/run/metrics.jsonl").open()]
    scores = [row["critic/score/mean"] for row in rows if "critic/score/mean" in row]
    assert len(scores) == RL_STEPS
    first, last = sum(scores[:8]) / 8, sum(scores[-8:]) / 8
    # measured here: sampled reward 0.23 over the first 8 steps, 0.36 over the last 8
    assert last >= first + 0.06, scores
    (_, before), (_, after) = trainer.validator.history[0], trainer.validator.history[-1]
    assert after[ACC] >= before[ACC], (before[ACC], after[ACC])  # measured: 0.58 -> 0.70 greedy accuracy
