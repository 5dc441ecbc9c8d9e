"""The loss scale does not depend on how a mini-batch is split into micro-batches (verl 0.9.1's
global-batch normalisation), for the actor and the critic, with every aggregation mode."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from verl.algorithms.actor_loss import compute_actor_loss, compute_critic_loss
from verl.algorithms.loss_agg import LOSS_AGG_MODES
from verl.config.actor import ActorConfig
from verl.config.algorithm import PolicyLossConfig
from verl.protocol import DataProto
from verl.workers.engine.micro_batch import split_micro_batches
from verl.workers.ppo_update import mini_batch_counts

B, R = 6, 5
KEYS = ["response_mask", "old_log_probs", "advantages", "values", "returns", "ref_log_prob"]


def mini_batch() -> DataProto:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 2, 0, 4, 1, 3])  # one empty response
    mask = (torch.arange(R) < lengths.unsqueeze(1)).float()
    tensors = {
        "response_mask": mask,
        "old_log_probs": -torch.rand(B, R, generator=gen),
        "advantages": torch.randn(B, R, generator=gen),
        "values": torch.randn(B, R, generator=gen),
        "returns": torch.randn(B, R, generator=gen),
        "ref_log_prob": -torch.rand(B, R, generator=gen),
    }
    return DataProto.from_dict(tensors)


def gradient(data: DataProto, micro_size: int, loss_fn, start: torch.Tensor) -> tuple[torch.Tensor, float]:
    """What the engine accumulates: sum over micro-batches of ``row share * loss``."""
    theta = start.clone().requires_grad_(True)
    micro_batches, groups = split_micro_batches(data, KEYS, micro_size)
    counts = mini_batch_counts(data)
    total, metric = 0.0, 0.0
    for micro, rows in zip(micro_batches, groups, strict=True):
        loss, metrics = loss_fn(theta[torch.as_tensor(rows)], {**micro, **counts})
        share = len(rows) / len(data)
        total = total + loss * share
        metric += next(v for k, v in metrics.items() if k.endswith("_loss")) * share
    total.backward()
    return theta.grad, metric


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo", "sapo", "geo_mean", "gpg"])
def test_actor_gradient_is_the_same_for_any_micro_batch_size(mode, loss_mode):
    data = mini_batch()
    config = ActorConfig(
        loss_agg_mode=mode,
        use_kl_loss=True,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        entropy_coeff=0.0,
    )
    start = data.batch["old_log_probs"] + 0.1

    def loss_fn(log_prob, micro):
        return compute_actor_loss(log_prob, None, micro, config)

    whole, whole_metric = gradient(data, B, loss_fn, start)
    for micro_size in (1, 2, 4):
        parts, parts_metric = gradient(data, micro_size, loss_fn, start)
        assert_close(parts, whole)
        assert parts_metric == pytest.approx(whole_metric, rel=1e-5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_critic_gradient_is_the_same_for_any_micro_batch_size(mode):
    data = mini_batch()
    config = ActorConfig(loss_agg_mode=mode)
    config.cliprange_value = 0.2

    def loss_fn(vpreds, micro):
        return compute_critic_loss(vpreds, micro, config)

    whole, _ = gradient(data, B, loss_fn, data.batch["values"] + 0.3)
    parts, _ = gradient(data, 2, loss_fn, data.batch["values"] + 0.3)
    assert_close(parts, whole)


def test_one_micro_batch_on_one_rank_is_the_plain_loss():
    data = mini_batch()
    micro = {k: data.batch[k] for k in KEYS}
    config = ActorConfig(loss_agg_mode="token-mean")
    log_prob = data.batch["old_log_probs"] + 0.1
    plain, _ = compute_actor_loss(log_prob, None, micro, config)
    counted, _ = compute_actor_loss(log_prob, None, {**micro, **mini_batch_counts(data)}, config)
    assert_close(counted, plain)


def test_mini_batch_counts():
    counts = mini_batch_counts(mini_batch())
    assert {k: int(v) for k, v in counts.items()} == {
        "dp_size": 1,
        "batch_num_tokens": 15,
        "global_batch_size": 6,
    }
