"""verl's documented ``verl.utils`` helpers, imported from verl's paths and called as verl's docs and
recipes call them, against hand-computed values."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from tests.utils.dataset.char_tokenizer import make_char_tokenizer
from verl.trainer.ppo.checkpoint import Checkpointer
from verl.utils import hdfs_io, hf_processor, hf_tokenizer
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
from verl.utils.dataset.schema import DatasetError, make_row
from verl.utils.device import get_device_id, get_device_name, get_torch_device, is_cuda_available
from verl.utils.fs import copy_to_local
from verl.utils.fsdp_utils import get_fsdp_wrap_policy, offload_fsdp_optimizer
from verl.utils.profiler import GPUMemoryLogger, log_gpu_memory_usage, marked_timer, simple_timer
from verl.utils.py_functional import append_to_dict, convert_to_regular_types
from verl.utils.seqlen_balancing import (
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    rearrange_micro_batches,
)
from verl.utils.torch_functional import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    logprobs_from_logits,
    masked_mean,
    masked_whiten,
    pad_sequence_to_length,
)
from verl.utils.tracking import Tracking
from verl.utils.ulysses import gather_outputs_and_unpad, ulysses_pad, ulysses_pad_and_slice_inputs

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- files
def test_copy_to_local_returns_a_local_path_as_it_is(tmp_path):
    assert copy_to_local(str(tmp_path)) == str(tmp_path)
    assert copy_to_local("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.skipif(shutil.which("hdfs") is not None, reason="an hdfs client is installed here")
def test_copy_to_local_of_an_hdfs_path_without_the_hdfs_client_says_what_is_missing(tmp_path):
    with pytest.raises(hdfs_io.HdfsUnavailableError, match=r"hdfs://nn/model: .*`hdfs` command-line client"):
        copy_to_local("hdfs://nn/model", cache_dir=str(tmp_path))


def test_hdfs_io_makes_checks_and_copies_local_folders(tmp_path):
    source = tmp_path / "a" / "b"
    hdfs_io.makedirs(str(source))
    hdfs_io.makedirs(str(source), exist_ok=True)
    (source / "f.txt").write_text("x")
    assert hdfs_io.exists(str(source / "f.txt")) and not hdfs_io.exists(str(tmp_path / "nope"))
    hdfs_io.copy(str(tmp_path / "a"), str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "b" / "f.txt").read_text() == "x"


# ---------------------------------------------------------------------------- small helpers
def test_append_to_dict_collects_values_and_lists_per_key():
    metrics: dict[str, list] = {}
    append_to_dict(metrics, {"loss": 0.5, "lr": 1e-3})
    append_to_dict(metrics, {"loss": [0.25, 0.125]})
    append_to_dict(metrics, {"loss": 1.0}, prefix="val/")
    assert metrics == {"loss": [0.5, 0.25, 0.125], "lr": [1e-3], "val/loss": [1.0]}


def test_convert_to_regular_types_turns_omegaconf_into_plain_containers():
    plain = convert_to_regular_types(OmegaConf.create({"a": [1, {"b": (2, 3)}]}))
    assert plain == {"a": [1, {"b": [2, 3]}]} and type(plain) is dict and type(plain["a"]) is list


def test_hf_tokenizer_fills_a_missing_pad_token_with_eos_and_a_text_model_has_no_processor(tmp_path):
    tokenizer = make_char_tokenizer()
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="pad_token"):
        loaded = hf_tokenizer(str(tmp_path))
    assert loaded.pad_token == "<eos>" and loaded.pad_token_id == loaded.eos_token_id == 1
    assert hf_processor(str(tmp_path)) is None


# ---------------------------------------------------------------------------- dataset
def test_rlhf_dataset_takes_verls_dictconfig_data_section_and_collates_a_batch(tmp_path):
    rows = [
        make_row("arith", "3+4=", "arithmetic", "7", "train", 0),
        make_row("arith", "1+1=", "arithmetic", "2", "train", 1),
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    config = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 6, "truncation": "left"})
    dataset = RLHFDataset(str(tmp_path / "train.parquet"), make_char_tokenizer(), config, processor=None)
    assert dataset.config.max_prompt_length == 6 and dataset.config.truncation == "left"
    batch = collate_fn([dataset[0], dataset[1]])
    assert batch["input_ids"].shape == (2, 6) and batch["data_source"].tolist() == ["arith", "arith"]
    with pytest.raises(DatasetError, match="not_a_data_key"):
        RLHFDataset(str(tmp_path / "train.parquet"), make_char_tokenizer(), {"not_a_data_key": 1})


# ---------------------------------------------------------------------------- torch functional
def test_masked_whiten_gives_mean_zero_and_unit_unbiased_std_on_the_masked_entries():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 6.0, -7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    assert masked_mean(values, mask).item() == pytest.approx(3.5)
    whitened = masked_whiten(values, mask)[mask.bool()]
    assert whitened.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert whitened.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-6)
    # the first entry: (1 - 3.5) / sqrt(3.5), the unbiased variance of 1..6 being 3.5
    assert whitened[0].item() == pytest.approx(-2.5 / math.sqrt(3.5), abs=1e-6)


def test_logprobs_from_logits_is_the_log_softmax_at_the_labels():
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(2.0), math.log(2.0)]]])
    labels = torch.tensor([[1, 0]])
    assert logprobs_from_logits(logits, labels)[0].tolist() == pytest.approx([math.log(0.75), math.log(0.5)])


def lr_sequence(make_schedule, steps: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = make_schedule(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


def test_constant_schedule_with_warmup_ramps_linearly_then_holds():
    lrs = lr_sequence(lambda opt: get_constant_schedule_with_warmup(opt, num_warmup_steps=4), 7)
    assert lrs == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_cosine_schedule_with_warmup_descends_to_its_floor():
    lrs = lr_sequence(
        lambda opt: get_cosine_schedule_with_warmup(opt, 2, num_training_steps=6, min_lr_ratio=0.2), 7
    )
    # after warmup: 0.2 + 0.8 * (1 + cos(pi * k / 4)) / 2 for k = 0..4, ending at the floor 0.2
    cosine = [0.2 + 0.8 * (1 + math.cos(math.pi * k / 4)) / 2 for k in range(5)]
    assert lrs == pytest.approx([0.0, 0.5, *cosine]) and lrs[-1] == pytest.approx(0.2)


def test_pad_sequence_to_length_pads_the_last_axis_on_either_side():
    rows = torch.tensor([[1, 2], [3, 4]])
    assert pad_sequence_to_length(rows, 4, 0).tolist() == [[1, 2, 0, 0], [3, 4, 0, 0]]
    assert pad_sequence_to_length(rows, 3, 9, left_pad=True).tolist() == [[9, 1, 2], [9, 3, 4]]
    assert pad_sequence_to_length(rows, 2, 0) is rows


# ---------------------------------------------------------------------------- balancing
def test_rearranged_micro_batches_put_back_by_the_reverse_index_restore_the_rows():
    lengths = [5, 1, 8, 2, 7, 3]
    mask = torch.tensor([[1] * n + [0] * (8 - n) for n in lengths])
    batch = {"attention_mask": mask, "row": torch.arange(6)}
    micro_batches, partitions = rearrange_micro_batches(batch, max_token_len=10)
    assert len(micro_batches) == math.ceil(sum(lengths) / 10) == 3
    assert sorted(i for part in partitions for i in part) == list(range(6))
    for micro, part in zip(micro_batches, partitions):
        assert micro["row"].tolist() == part
    flat = [i for part in partitions for i in part]
    restored = torch.cat([m["row"] for m in micro_batches])[torch.tensor(get_reverse_idx(flat))]
    assert restored.tolist() == list(range(6))


def test_equal_size_partitions_hold_the_same_number_of_rows_with_close_sums():
    partitions = get_seqlen_balanced_partitions([10, 1, 9, 2, 8, 3], k_partitions=2, equal_size=True)
    assert [len(p) for p in partitions] == [3, 3]
    sums = [sum([10, 1, 9, 2, 8, 3][i] for i in p) for p in partitions]
    assert abs(sums[0] - sums[1]) <= 3


# ---------------------------------------------------------------------------- ulysses (no group)
def test_ulysses_pad_continues_positions_and_without_a_group_slicing_and_gathering_are_identities():
    ids, positions = torch.tensor([[5, 6, 7]]), torch.tensor([[0, 1, 2]])
    padded, padded_positions, pad = ulysses_pad(ids, positions, sp_size=4)
    assert padded.tolist() == [[5, 6, 7, 0]] and padded_positions.tolist() == [[0, 1, 2, 0]] and pad == 1
    same_ids, same_positions, no_pad = ulysses_pad_and_slice_inputs(ids, positions, sp_size=1)
    assert same_ids is ids and same_positions is positions and no_pad == 0
    x = torch.randn(1, 4, 3)
    assert gather_outputs_and_unpad(x, gather_dim=1, unpad_dim=1, padding_size=1) is x
    with pytest.raises(RuntimeError, match="set_ulysses_sequence_parallel_group"):
        ulysses_pad_and_slice_inputs(ids, positions, sp_size=2)


# ---------------------------------------------------------------------------- checkpoints
def linear_with_state(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    schedule = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=10)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    schedule.step()
    return model, optimizer, schedule


def test_find_latest_ckpt_path_finds_the_step_a_checkpointer_committed_and_a_manager_reloads_it(tmp_path):
    model, optimizer, schedule = linear_with_state(0)
    manager = FSDPCheckpointManager(
        model, optimizer, schedule, checkpoint_config={"save_contents": ["model", "optimizer", "extra"]}
    )
    checkpointer = Checkpointer(str(tmp_path), "auto", None, world_size=1)
    assert find_latest_ckpt_path(str(tmp_path)) is None
    for step in (2, 3):
        checkpointer.save(
            step, lambda folder, n=step: manager.save_checkpoint(f"{folder}/actor", global_step=n), {}
        )
    latest = find_latest_ckpt_path(str(tmp_path))
    assert latest == str(tmp_path / "global_step_3")
    fresh_model, fresh_optimizer, fresh_schedule = linear_with_state(1)
    FSDPCheckpointManager(fresh_model, fresh_optimizer, fresh_schedule).load_checkpoint(f"{latest}/actor")
    assert torch.equal(fresh_model.weight, model.weight) and torch.equal(fresh_model.bias, model.bias)
    moments = [s["exp_avg"] for s in optimizer.state.values()]
    assert all(
        torch.equal(a, b) for a, b in zip([s["exp_avg"] for s in fresh_optimizer.state.values()], moments)
    )
    assert fresh_schedule.state_dict() == schedule.state_dict()


def test_the_checkpoint_manager_keeps_at_most_max_ckpt_to_keep_folders(tmp_path):
    model, optimizer, schedule = linear_with_state(0)
    manager = FSDPCheckpointManager(model, optimizer, schedule)
    for step in range(1, 4):
        manager.save_checkpoint(str(tmp_path / f"global_step_{step}"), global_step=step, max_ckpt_to_keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", "global_step_3"]


# ---------------------------------------------------------------------------- tracking, timers, device
def test_tracking_with_verls_constructor_logs_a_step_to_the_console(capsys):
    tracker = Tracking(project_name="p", experiment_name="e", default_backend="console", config={"a": 1})
    tracker.log(data={"score": 0.5}, step=7)
    tracker.finish()
    assert capsys.readouterr().out.strip() == "step:7 - score:0.500"


def test_timers_add_up_the_seconds_of_each_named_phase_on_cpu():
    timing: dict[str, float] = {}
    with simple_timer("gen", timing):
        torch.ones(10).sum()
    first = timing["gen"]
    with simple_timer("gen", timing), marked_timer("reward", timing, color="red"):
        pass
    assert timing["gen"] >= first > 0 and timing["reward"] >= 0 and set(timing) == {"gen", "reward"}


def test_memory_logging_decorates_and_reports_on_cpu(capsys):
    @GPUMemoryLogger(role="actor")
    def update(x):
        return x + 1

    assert update(1) == 2
    log_gpu_memory_usage("after init")
    out = capsys.readouterr().out
    assert "Before update" in out and "After update" in out and "after init, memory allocated (GB)" in out


def test_device_helpers_name_the_accelerator_or_the_cpu():
    assert is_cuda_available == torch.cuda.is_available()
    assert get_device_name() == ("cuda" if is_cuda_available else "cpu")
    assert get_torch_device() is (torch.cuda if is_cuda_available else torch.cpu)
    assert get_device_id() == (torch.cuda.current_device() if is_cuda_available else "cpu")


def test_fsdp_wrap_policy_wraps_the_named_blocks_and_optimizer_offload_keeps_values():
    class Block(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(Block(2, 2), torch.nn.ReLU())
    policy = get_fsdp_wrap_policy(model, {"transformer_layer_cls_to_wrap": ["Block"]})
    assert policy(module=model[0], recurse=False, nonwrapped_numel=6)
    assert not policy(module=model[1], recurse=False, nonwrapped_numel=0)
    assert get_fsdp_wrap_policy(model, {"disable": True}) is None
    _, optimizer, _ = linear_with_state(0)
    before = [s["exp_avg"].clone() for s in optimizer.state.values()]
    offload_fsdp_optimizer(optimizer)
    assert all(np.allclose(a, s["exp_avg"]) for a, s in zip(before, optimizer.state.values()))


@pytest.mark.slow
def test_ulysses_helpers_over_two_gloo_ranks_slice_gather_and_exchange_heads(tmp_path):
    report = tmp_path / "report.json"
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    script = REPO / "tests" / "utils" / "ulysses_verl_ranks.py"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
    ]
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*command, str(report)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    first, second = json.loads(report.read_text())
    assert first["ids"] == [[10, 11, 12]] and second["ids"] == [[13, 14, 0]]
    assert first["positions"] == [[0, 1, 2]] and second["positions"] == [[3, 4, 0]] and first["pad"] == 1
    assert first["gathered"] == second["gathered"] == [[10, 11, 12, 13, 14]]
    # grad_scaler: times the group's size; the pad position was dropped, so it gets none
    assert first["grad"] == [[2.0, 2.0, 2.0]] and second["grad"] == [[2.0, 2.0, 0.0]]
    assert first["all_to_all_shape"] == [1, 6, 1, 2] and first["round_trip"] and second["round_trip"]
    assert first["world"] == 2
