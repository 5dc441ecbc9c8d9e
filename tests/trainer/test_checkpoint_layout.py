"""The checkpoint directory rules, without Ray: pointer, resume modes, rotation, atomic writes."""

from __future__ import annotations

import os

import pytest

from verl.trainer.ppo import checkpoint as ckpt
from verl.utils.checkpoint_io import CheckpointReadError


def make_step(root, step: int, roles=("actor",), complete: bool = True) -> str:
    folder = ckpt.prepare_step_dir(str(root), step)
    for role in roles:
        os.makedirs(os.path.join(folder, role))
        open(os.path.join(folder, role, "shard"), "w").close()
    if complete:
        ckpt.save_driver_state(folder, {"global_steps": step})
        ckpt.write_pointer(str(root), step)
    return folder


def test_auto_resume_follows_the_pointer_not_the_newest_directory(tmp_path):
    assert ckpt.resolve_resume_dir("auto", str(tmp_path), None) is None
    make_step(tmp_path, 2)
    make_step(tmp_path, 4)
    make_step(tmp_path, 6, complete=False)  # a save cut off by a crash
    assert ckpt.resolve_resume_dir("auto", str(tmp_path), None) == ckpt.step_dir(str(tmp_path), 4)
    assert ckpt.resolve_resume_dir("disable", str(tmp_path), None) is None
    assert ckpt.load_driver_state(ckpt.step_dir(str(tmp_path), 4))["global_steps"] == 4


def test_rewriting_a_partial_step_starts_from_an_empty_directory(tmp_path):
    folder = make_step(tmp_path, 6, complete=False)
    assert os.listdir(os.path.join(folder, "actor")) == ["shard"]
    folder = ckpt.prepare_step_dir(str(tmp_path), 6)
    assert os.listdir(folder) == []


def test_resume_path_must_be_a_complete_step_directory(tmp_path):
    good = make_step(tmp_path, 3)
    assert ckpt.resolve_resume_dir("resume_path", str(tmp_path / "elsewhere"), good) == good
    with pytest.raises(ValueError, match="global_step_N"):
        ckpt.resolve_resume_dir("resume_path", str(tmp_path), str(tmp_path))
    partial = make_step(tmp_path, 5, complete=False)
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        ckpt.resolve_resume_dir("resume_path", str(tmp_path), partial)


def test_a_corrupt_pointer_is_a_clear_error(tmp_path):
    make_step(tmp_path, 1)
    (tmp_path / ckpt.POINTER_FILE).write_text("latest")
    with pytest.raises(ValueError, match="one step number"):
        ckpt.read_pointer(str(tmp_path))
    (tmp_path / ckpt.POINTER_FILE).write_text("9")
    with pytest.raises(FileNotFoundError, match="names step 9"):
        ckpt.read_pointer(str(tmp_path))


def test_rotation_keeps_the_newest_per_role(tmp_path):
    for step in (1, 2, 3, 4):
        make_step(tmp_path, step, roles=("actor", "critic"))
    removed = ckpt.rotate(str(tmp_path), "actor", 2, latest=4)
    assert sorted(os.path.basename(os.path.dirname(p)) for p in removed) == ["global_step_1", "global_step_2"]
    assert ckpt.saved_steps(str(tmp_path)) == [1, 2, 3, 4]  # the critics are still there
    ckpt.rotate(str(tmp_path), "critic", 3, latest=4)
    assert ckpt.saved_steps(str(tmp_path)) == [2, 3, 4]  # step 1 had nothing left
    assert ckpt.rotate(str(tmp_path), "actor", None, latest=4) == []


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "f.txt"
    ckpt.atomic_write_bytes(str(path), b"one")
    ckpt.atomic_write_bytes(str(path), b"two")
    assert path.read_bytes() == b"two" and os.listdir(tmp_path) == ["f.txt"]


# ---------------------------------------------------------------------------- unreadable files
def test_a_corrupt_driver_state_names_the_file_the_step_and_the_previous_step(tmp_path):
    make_step(tmp_path, 2)
    folder = make_step(tmp_path, 4)
    driver = os.path.join(folder, ckpt.DRIVER_FILE)
    with open(driver, "r+b") as f:
        f.truncate(os.path.getsize(driver) // 2)
    with pytest.raises(CheckpointReadError) as info:
        ckpt.load_driver_state(folder)
    message = str(info.value)
    assert f"cannot read {driver}" in message and "checkpoint of step 4" in message
    assert f"trainer.resume_from_path={ckpt.step_dir(str(tmp_path), 2)}" in message


def test_a_corrupt_first_checkpoint_says_to_start_afresh(tmp_path):
    folder = make_step(tmp_path, 1)
    with open(os.path.join(folder, ckpt.DRIVER_FILE), "wb") as f:
        f.write(b"not a torch file")
    with pytest.raises(CheckpointReadError, match=r"no earlier complete checkpoint.*resume_mode=disable"):
        ckpt.load_driver_state(folder)


def test_a_truncated_dcp_shard_names_the_shard(tmp_path):
    import torch

    from verl.config.engine import FSDPConfig, OptimConfig
    from verl.workers.engine.fsdp import FSDPEngine

    make_step(tmp_path, 1)
    folder = os.path.join(make_step(tmp_path, 2), "actor")
    engine = FSDPEngine(torch.nn.Linear(64, 64), torch.device("cpu"), FSDPConfig(), optim=OptimConfig())
    engine.save(folder, ["model", "optimizer", "extra"])
    shards = sorted(f for f in os.listdir(folder) if f.endswith(".distcp"))
    shard = os.path.join(folder, shards[0])
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    with pytest.raises(CheckpointReadError) as info:
        engine.load(folder, ["model", "optimizer", "extra"])
    message = str(info.value)
    assert f"cannot read {shard}" in message and "step 2" in message
    assert f"trainer.resume_from_path={ckpt.step_dir(str(tmp_path), 1)}" in message
