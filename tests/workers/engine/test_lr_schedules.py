"""verl's Megatron LR keys (``optim.lr_decay_style``, ``lr_decay_steps``, ``min_lr``,
``lr_warmup_init``) give megatron-core's own ``OptimizerParamScheduler`` learning rates at every step,
whichever engine trains; the FSDP keys keep their schedule; both at once are refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from verl.config.base import ConfigError
from verl.config.engine import OptimConfig
from verl.workers.engine.optim import lr_multiplier

TOTAL = 40


def megatron_core_lrs(config: OptimConfig, warmup: int) -> list[float]:
    """megatron-core 0.16's scheduler (the reference), over the steps 0..TOTAL+4."""
    scheduler_module = pytest.importorskip("megatron.core.optimizer_param_scheduler")
    scheduler = scheduler_module.OptimizerParamScheduler(
        SimpleNamespace(param_groups=[{}]),
        init_lr=config.lr_warmup_init,
        max_lr=config.lr,
        min_lr=config.min_lr,
        lr_warmup_steps=warmup,
        lr_decay_steps=config.lr_decay_steps or TOTAL,
        lr_decay_style=config.lr_decay_style.replace("_", "-"),  # megatron spells inverse-square-root
        start_wd=config.weight_decay,
        end_wd=config.weight_decay,
        wd_incr_steps=TOTAL,
        wd_incr_style="constant",
    )
    lrs = []
    for step in range(TOTAL + 5):
        scheduler.num_steps = step
        lrs.append(scheduler.get_lr({}))
    return lrs


@pytest.mark.parametrize("style", ["constant", "linear", "cosine", "inverse_square_root"])
@pytest.mark.parametrize(
    "warmup,init,floor,decay_steps", [(0, 0.0, 0.0, None), (5, 1e-7, 2e-7, None), (8, 0.0, 1e-7, 30)]
)
def test_the_megatron_schedule_equals_megatron_cores(style, warmup, init, floor, decay_steps):
    config = OptimConfig(
        lr=1e-6,
        lr_warmup_steps=warmup,
        lr_decay_style=style,
        lr_warmup_init=init,
        min_lr=floor,
        lr_decay_steps=decay_steps,
        total_training_steps=TOTAL,
    )
    config.validate("actor_rollout_ref.actor.optim")
    want = megatron_core_lrs(config, warmup)
    have = [config.lr * lr_multiplier(step, config) for step in range(TOTAL + 5)]
    assert have == pytest.approx(want, rel=1e-12, abs=1e-18)
    if style != "constant":
        assert have[-1] == pytest.approx(floor, abs=1e-18) and max(have) == pytest.approx(config.lr)


def test_the_fsdp_schedule_is_kept_without_the_megatron_keys():
    config = OptimConfig(lr=1e-3, lr_warmup_steps=4, lr_scheduler_type="cosine", total_training_steps=TOTAL)
    assert not config.megatron_schedule()
    assert lr_multiplier(2, config) == pytest.approx(0.5)  # warmup from 0
    assert lr_multiplier(TOTAL, config) == pytest.approx(0.0, abs=1e-12)  # cosine down to min_lr_ratio 0


@pytest.mark.parametrize(
    "fields,key",
    [
        (dict(lr_decay_style="cosine", lr_scheduler_type="cosine"), "lr_scheduler_type"),
        (dict(lr_decay_style="exponential"), "lr_decay_style"),
        (dict(weight_decay_incr_style="linear"), "weight_decay_incr_style"),
        (dict(min_lr=-1.0), "min_lr"),
    ],
)
def test_bad_megatron_schedule_keys_name_the_key(fields, key):
    with pytest.raises(ConfigError, match=rf"x\.optim\.{key}"):
        OptimConfig(**fields).validate("x.optim")
