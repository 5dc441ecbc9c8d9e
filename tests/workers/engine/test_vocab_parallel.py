"""Log-probs, entropy and sum p^2 from vocab-parallel logits equal the full-vocabulary values, and so
do their gradients with respect to each rank's slice (2 gloo ranks, megatron-core's TP group)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.megatron.ranks import run_ranks

B, R, V = 3, 5, 12


def full_values(logits: torch.Tensor, labels: torch.Tensor):
    logits = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)
    log_probs = logp.gather(-1, labels[..., None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    (log_probs.sum() + 0.3 * entropy.sum()).backward()
    return log_probs.detach(), entropy.detach(), logp.exp().square().sum(-1).detach(), logits.grad


def sliced_values(rank, world, logits, labels):
    from megatron.core import parallel_state as ps

    from verl.workers.engine.megatron import vocab_parallel

    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    group = ps.get_tensor_model_parallel_group()
    width = V // world
    mine = logits[..., rank * width : (rank + 1) * width].clone().requires_grad_(True)
    log_probs, entropy = vocab_parallel.log_probs_and_entropy(mine, labels, group, entropy=True)
    (log_probs.sum() + 0.3 * entropy.sum()).backward()
    return log_probs.detach(), entropy.detach(), vocab_parallel.sum_pi_squared(mine, group), mine.grad


def test_vocab_parallel_equals_the_full_vocabulary():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, R, V, generator=g) * 3
    labels = torch.randint(0, V, (B, R), generator=g)
    want = full_values(logits, labels)
    ranks = run_ranks(sliced_values, 2, logits, labels)
    for got in ranks:
        for a, b in zip(want[:3], got[:3]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # each rank's slice gets the gradient of its own logits
    grad = torch.cat([got[3] for got in ranks], dim=-1)
    torch.testing.assert_close(grad, want[3], atol=1e-5, rtol=1e-5)
