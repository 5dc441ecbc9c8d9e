"""The SFT trainer on the Megatron engine (``engine=megatron``): tensor parallel 2 on 2 ranks trains
with the FSDP engine's losses on the same data and seed, lowers the validation loss, and a run
resumed from its checkpoint continues bit for bit; a split the model or the ranks cannot take is
refused naming the key, before anything is built.

The Megatron runs are real megatron-core over gloo in 2 spawned processes, behind the test-only CPU
shim (tests/megatron/ranks.py, tests/megatron/cpu_shim.py); the FSDP reference runs in this process
(one rank: plain torch). Each configuration runs once, shared by the tests (module fixture)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from tests.megatron.ranks import run_ranks
from tests.trainer.test_sft_trainer import metric_stream, sft_config
from verl.config.base import ConfigError
from verl.config.rm_trainer import load_rm_config
from verl.config.sft_trainer import load_sft_config
from verl.model_merger.megatron import merge_megatron_checkpoint
from verl.trainer.sft_trainer import SFTTrainer, run_sft

STEPS = 3
RUN = [
    f"trainer.total_training_steps={STEPS}",
    "trainer.save_freq=2",
    "data.val_max_samples=64",
    "optim.lr=1e-4",  # the preset's 5e-4 first raises the validation loss (0.71 -> 0.89 in 3 steps)
]
"""Three steps of the embedded default (64 rows a step), saved at steps 2 and 3, validated before and after."""
MEGATRON = ["engine=megatron", "optim=megatron", "engine.tensor_model_parallel_size=2"]
TOL = 1e-5
"""fp32 on both engines; tensor parallelism only changes the order of sums (measured gaps below)."""


def _megatron_runs(rank: int, world: int, root: str) -> None:
    """On each rank: the 3-step run, then a run resumed from its step-2 checkpoint (same processes)."""
    first, resumed = Path(root, "megatron"), Path(root, "resumed")
    os.chdir(first)  # logs/ goes here (rank 0 writes them)
    run_sft(sft_config(first, *RUN, *MEGATRON))
    os.chdir(resumed)
    resume = [
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={first / 'ckpt' / 'global_step_2'}",
    ]
    run_sft(sft_config(resumed, *RUN, *MEGATRON, *resume))


@pytest.fixture(scope="module")
def streams(builtin_assets, tmp_path_factory) -> dict[str, dict[int, dict[str, float]]]:
    """Step -> metrics of the FSDP reference, the Megatron run and the resumed Megatron run."""
    root = tmp_path_factory.mktemp("sft_megatron")
    for name in ("fsdp", "megatron", "resumed"):
        (root / name).mkdir()
    cwd = os.getcwd()
    try:
        os.chdir(root / "fsdp")
        run_sft(sft_config(root / "fsdp", *RUN))  # also writes the built-in chats the ranks read
    finally:
        os.chdir(cwd)
    run_ranks(_megatron_runs, 2, str(root))
    out = {name: metric_stream(root / name) for name in ("fsdp", "megatron", "resumed")}
    out["shards"] = sorted(p.name for p in (root / "megatron/ckpt/global_step_2/model").glob("megatron_*.pt"))
    out["root"] = root
    return out


@pytest.mark.slow  # the shared runs: about 40 s on 2 CPU cores
def test_tensor_parallel_megatron_trains_with_the_fsdp_losses(streams):
    fsdp, megatron = streams["fsdp"], streams["megatron"]
    assert sorted(megatron) == sorted(fsdp) == list(range(STEPS + 1))
    for step in range(1, STEPS + 1):
        for key in ("train/loss", "train/grad_norm", "train/tokens", "train/lr"):
            assert megatron[step][key] == pytest.approx(fsdp[step][key], rel=TOL, abs=TOL), (step, key)
    for step in (0, STEPS):
        assert megatron[step]["val/loss"] == pytest.approx(fsdp[step]["val/loss"], rel=TOL, abs=TOL), step


@pytest.mark.slow  # the shared runs: about 40 s on 2 CPU cores
def test_tensor_parallel_megatron_lowers_the_validation_loss(streams):
    megatron = streams["megatron"]
    assert megatron[STEPS]["val/loss"] < megatron[0]["val/loss"] - 0.01, megatron


@pytest.mark.slow  # the shared runs: about 40 s on 2 CPU cores
def test_a_megatron_run_resumed_from_its_checkpoint_continues_bit_for_bit(streams):
    assert streams["shards"] == ["megatron_rank_0.pt", "megatron_rank_1.pt"]
    assert sorted(streams["resumed"]) == [3]
    assert streams["resumed"][3] == streams["megatron"][3]


@pytest.mark.slow  # the shared runs: about 40 s on 2 CPU cores
def test_the_megatron_checkpoint_exports_to_a_model_with_the_runs_validation_loss(streams):
    root = streams["root"]
    merged = merge_megatron_checkpoint(
        str(root / f"megatron/ckpt/global_step_{STEPS}/model"), str(root / "merged")
    )
    trainer = SFTTrainer(sft_config(root / "check", f"model.path={merged}", "data.val_max_samples=64"))
    try:
        assert trainer.validate()["val/loss"] == pytest.approx(
            streams["megatron"][STEPS]["val/loss"], rel=TOL
        )
    finally:
        trainer.close()


@pytest.mark.usefixtures("builtin_assets")
def test_a_split_the_model_or_the_ranks_cannot_take_is_refused_naming_the_key(tmp_path):
    """The built-in model has 4 attention heads and 2 key/value heads; this process is one rank."""
    with pytest.raises(
        ConfigError, match=r"engine.tensor_model_parallel_size: expected a divisor of the model's 4"
    ):
        SFTTrainer(sft_config(tmp_path, "engine=megatron", "engine.tensor_model_parallel_size=3"))
    with pytest.raises(
        ConfigError, match=r"engine.tensor_model_parallel_size: expected a size .* divides the 1"
    ):
        SFTTrainer(sft_config(tmp_path, *MEGATRON))


def test_what_the_megatron_engine_lacks_is_refused_and_the_other_engines_keys_noted(caplog):
    with pytest.raises(ConfigError, match=r"engine.context_parallel_size=2: megatron-core's local"):
        load_sft_config(["engine=megatron", "engine.context_parallel_size=2"])
    with pytest.raises(ConfigError, match=r"model.lora_rank: expected 0 with engine=megatron"):
        load_sft_config(["engine=megatron", "model.lora_rank=8"])
    sp = ["engine.ulysses_sequence_parallel_size=2", "model.use_remove_padding=true"]
    with pytest.raises(
        ConfigError, match=r"engine.ulysses_sequence_parallel_size: expected 1 with engine=megatron"
    ):
        load_sft_config(["engine=megatron", *sp])
    with pytest.raises(ConfigError, match=r"engine.strategy: expected fsdp or fsdp2"):
        load_rm_config(["engine.strategy=megatron"])
    with caplog.at_level("WARNING"):
        load_sft_config(["engine=megatron", "engine.fsdp_size=2"])
        load_sft_config(["engine.tensor_model_parallel_size=2"])  # engine=fsdp
    notes = [r.getMessage() for r in caplog.records if "has no effect here" in r.getMessage()]
    assert [n.split("=")[0] for n in notes] == [
        "config note: engine.fsdp_size",
        "config note: engine.tensor_model_parallel_size",
    ]
