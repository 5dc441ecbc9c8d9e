"""Metric values on small batches computed by hand."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import psutil
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_mfu,
    compute_perf_metrics,
    compute_throughout_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    device_peak_flops,
    estimate_flops,
    reduce_metrics,
)

PAD = 99.0  # on padded positions: any leak into a masked statistic shows up


def _batch() -> DataProto:
    """3 rows, prompt length 3 (left-padded), response length 4; responses of 2, 4, 4 tokens."""
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    scores = torch.zeros(3, 4)
    scores[0, 1], scores[1, 3], scores[2, 3] = 1.0, 0.0, 0.5  # at the last response token
    rewards = scores - 0.1 * response_mask  # a KL penalty of 0.1 per response token
    advantages = torch.tensor([[1.0, 2.0, PAD, PAD], [-1.0, -1.0, -1.0, -1.0], [0.0, 0.0, 0.0, 3.0]])
    returns = torch.tensor([[2.0, 0.0, PAD, PAD], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 4.0]])
    values = torch.tensor([[1.0, 1.0, PAD, PAD], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 4.0]])
    return DataProto.from_dict(
        {
            "responses": torch.ones(3, 4, dtype=torch.long),
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "response_mask": response_mask,
            "token_level_scores": scores,
            "token_level_rewards": rewards,
            "advantages": advantages,
            "returns": returns,
            "values": values,
        }
    )


def test_data_metrics_by_hand():
    m = compute_data_metrics(_batch(), use_critic=True)
    # scores per sequence 1, 0, 0.5; rewards 1-0.2, 0-0.4, 0.5-0.4
    assert m["critic/score/mean"] == pytest.approx(0.5)
    assert (m["critic/score/max"], m["critic/score/min"]) == (1.0, 0.0)
    assert m["critic/rewards/mean"] == pytest.approx((0.8 - 0.4 + 0.1) / 3)
    assert m["critic/rewards/max"] == pytest.approx(0.8) and m["critic/rewards/min"] == pytest.approx(-0.4)
    # 10 valid tokens: advantages 1+2-4+3 = 2
    assert m["critic/advantages/mean"] == pytest.approx(0.2)
    assert (m["critic/advantages/max"], m["critic/advantages/min"]) == (3.0, -1.0)
    assert (m["critic/returns/mean"], m["critic/returns/max"], m["critic/returns/min"]) == (1.0, 4.0, 0.0)
    assert (m["critic/values/mean"], m["critic/values/max"], m["critic/values/min"]) == (1.0, 4.0, 0.0)
    # returns - values = (1, -1, 0 x 8): unbiased var 2/9; Var[returns] = 14/9
    assert m["critic/vf_explained_var"] == pytest.approx(1 - (2 / 9) / (14 / 9 + 1e-5))
    assert m["response_length/mean"] == pytest.approx(10 / 3)
    assert (m["response_length/max"], m["response_length/min"]) == (4.0, 2.0)
    assert m["response_length/clip_ratio"] == pytest.approx(2 / 3)
    assert (m["prompt_length/mean"], m["prompt_length/max"], m["prompt_length/min"]) == (2.0, 3.0, 1.0)
    assert m["prompt_length/clip_ratio"] == pytest.approx(1 / 3)
    assert m["response/aborted_ratio"] == 0.0


def test_data_metrics_without_critic_has_no_value_metrics():
    m = compute_data_metrics(_batch(), use_critic=False)
    assert not any(key.startswith("critic/values") for key in m)
    assert "critic/vf_explained_var" not in m
    assert m["critic/score/mean"] == pytest.approx(0.5)


def test_aborted_rows_are_left_out_of_score_stats():
    batch = _batch()
    batch.batch["attention_mask"][2, 3:] = 0  # row 2 produced nothing
    batch.batch["response_mask"][2] = 0
    m = compute_data_metrics(batch, use_critic=False)
    assert m["critic/score/mean"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    assert m["response_length/mean"] == pytest.approx(2.0)  # (2 + 4 + 0) / 3
    assert m["response_length_non_aborted/mean"] == pytest.approx(3.0)


def test_timing_metrics_per_token():
    # prompt tokens 2+3+1 = 6, response tokens 2+4+4 = 10
    m = compute_timing_metrics(_batch(), {"gen": 1.0, "ref": 0.32, "step": 2.0})
    assert m["timing_s/gen"] == 1.0 and m["timing_s/step"] == 2.0
    assert m["timing_per_token_ms/gen"] == pytest.approx(100.0)
    assert m["timing_per_token_ms/ref"] == pytest.approx(20.0)
    assert "timing_per_token_ms/step" not in m


def test_throughput_metrics():
    batch = _batch()
    m = compute_throughput_metrics(batch, {"step": 2.0}, n_workers=2)
    assert m == {"perf/total_num_tokens": 16, "perf/time_per_step": 2.0, "perf/throughput": 4.0}
    batch.meta_info["global_token_num"] = [10, 10, 20]
    assert compute_throughout_metrics(batch, {"step": 4.0}, n_workers=1)["perf/throughput"] == 10.0


def test_perf_metrics_count_child_processes():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; b = bytearray(200 * 2**20); time.sleep(60)"]
    )
    try:
        child_proc = psutil.Process(child.pid)
        deadline = time.time() + 20
        while child_proc.memory_info().rss < 200 * 2**20 and time.time() < deadline:
            time.sleep(0.05)
        own_gb = psutil.Process().memory_info().rss / 2**30
        m = compute_perf_metrics()
    finally:
        child.kill()
        child.wait()
    assert m["perf/cpu_memory_used_gb"] > own_gb + 0.19  # the child's 200 MiB is counted
    assert m["perf/cpu_memory_used_gb"] < psutil.virtual_memory().total / 2**30
    if not torch.cuda.is_available():
        assert "perf/max_memory_allocated_gb" not in m


TINY = dict(
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=10,
    tie_word_embeddings=False,
)


def test_flops_estimate_by_hand():
    config = Qwen2Config(**TINY)
    # per layer: MLP 3*8*16 = 384, attention 8*(q 8 + k 4 + v 4 + o 8) = 192; N = 2*576 + 2*10*8 = 1312
    # 6*N*T = 6*1312*8 = 62976; attention 12*(3^2 + 5^2)*head_dim 4*heads 2*layers 2 = 6528
    assert estimate_flops(config, [3, 5], seconds=2.0) == pytest.approx((62976 + 6528) / 2)


def test_flops_weight_count_matches_the_model():
    config = Qwen2Config(**TINY)
    model = Qwen2ForCausalLM(config)
    matmul_weights = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    # one token of length 1: 6*N + 12*1*head_dim*heads*layers
    attention = 12 * 1 * 4 * 2 * 2
    assert estimate_flops(config, [1], seconds=1.0) == 6 * matmul_weights + attention


def test_mfu_and_device_peaks():
    config = Qwen2Config(**TINY)
    m = compute_mfu(config, [3, 5], seconds=2.0, n_devices=2, device_name="NVIDIA H100 80GB HBM3")
    assert m["perf/mfu/actor"] == pytest.approx(34752 / (989e12 * 2))
    assert device_peak_flops("NVIDIA H200") == 989e12 and device_peak_flops("NVIDIA H20") == 148e12
    assert device_peak_flops("NVIDIA L40S") == 362e12 and device_peak_flops("NVIDIA L40") == 181e12
    assert compute_mfu(config, [3], 1.0, 1, device_name="some CPU") == {}


def test_unsupported_model_type_is_named():
    config = Qwen2Config(**TINY)
    config.model_type = "mamba"
    with pytest.raises(ValueError, match="'mamba'"):
        estimate_flops(config, [3], 1.0)
    assert compute_mfu(config, [3], 1.0, 1, device_name="NVIDIA H100") == {}


def test_reduce_metrics_list_of_dicts_and_dict_of_lists():
    rows = [{"actor/pg_loss": 1.0, "actor/entropy": torch.tensor(2.0)}, {"actor/pg_loss": 3.0}]
    assert reduce_metrics(rows) == {"actor/pg_loss": 2.0, "actor/entropy": 2.0}
    assert reduce_metrics({"actor/pg_loss": [1.0, 2.0, 6.0], "empty": []}) == {"actor/pg_loss": 3.0}
    assert math.isnan(reduce_metrics([{"x": float("nan")}])["x"])


@pytest.mark.gpu
def test_perf_metrics_report_cuda_peak_memory():
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # 0.25 GiB
    m = compute_perf_metrics()
    del x
    assert m["perf/max_memory_allocated_gb"] >= 0.25
    assert m["perf/max_memory_reserved_gb"] >= m["perf/max_memory_allocated_gb"]
