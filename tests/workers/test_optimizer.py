"""The engine's AdamW: fused on CPU, with the values of torch's reference (for-loop) AdamW to fp32 rounding."""

from __future__ import annotations

import torch

from verl.config.engine import OptimConfig
from verl.workers.engine.optim import build_optimizer


def _trained(make_optimizer) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in [(300, 77), (513,), (4096, 64)]
    ]
    grads = [[torch.randn(p.shape, generator=g) * 1e-3 for p in params] for _ in range(3)]
    optimizer = make_optimizer(params)
    for step in grads:
        for p, grad in zip(params, step):
            p.grad = grad
        optimizer.step()
    return [p.detach() for p in params]


def test_cpu_adamw_is_fused_and_equals_the_for_loop_adamw_to_fp32_rounding():
    config = OptimConfig(lr=1e-3, weight_decay=0.01)
    built = build_optimizer([torch.nn.Parameter(torch.zeros(2))], config)
    assert built.defaults["fused"] is True
    fused = _trained(lambda params: build_optimizer(params, config))
    reference = _trained(
        lambda params: torch.optim.AdamW(
            params, lr=1e-3, betas=tuple(config.betas), eps=config.eps, weight_decay=0.01, foreach=False
        )
    )
    for got, want in zip(fused, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=3e-7, atol=1e-9)  # the last bit of a few elements
    sgd = _trained(lambda params: torch.optim.SGD(params, lr=1e-3))[0]
    assert not torch.allclose(fused[0], sgd, rtol=3e-7, atol=1e-9)  # the comparison can fail
