"""mean@N / best@N / maj@N on tiny cases worked out by hand."""

from __future__ import annotations

import math

import pytest

from verl.trainer.ppo.metric_utils import flatten_validation_metrics, process_validation_metrics
from verl.trainer.ppo.val_metrics import bootstrap_metric, majority_value

# source "s": prompt u1 answered right 3 times out of 4, prompt u2 never; source "t": one response
SOURCES = ["s"] * 8 + ["t"]
UIDS = ["u1"] * 4 + ["u2"] * 4 + ["u3"]
ACC = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
REWARD = [2 * a - 1 for a in ACC]


def test_mean_and_std_at_n():
    out = process_validation_metrics(SOURCES, UIDS, {"acc": ACC})
    s = out["s"]["acc"]
    assert s["mean@4"] == pytest.approx((0.75 + 0.0) / 2)
    assert s["std@4"] == pytest.approx((math.sqrt(3 / 16) + 0.0) / 2)  # population std per prompt
    assert out["t"]["acc"] == {"mean@1": 1.0}  # one response: no std/best/worst


def test_best_and_worst_at_k_by_hand():
    s = process_validation_metrics(SOURCES, UIDS, {"acc": ACC})["s"]["acc"]
    # u1: best@k = P(some draw of k is right) = 1 - (1/4)^k, worst@k = (3/4)^k; u2: always 0
    assert s["best@2/mean"] == pytest.approx((1 - 1 / 16) / 2, abs=0.02)
    assert s["best@4/mean"] == pytest.approx((1 - 1 / 256) / 2, abs=0.02)
    assert s["worst@2/mean"] == pytest.approx((9 / 16) / 2, abs=0.03)
    assert s["worst@4/mean"] == pytest.approx((81 / 256) / 2, abs=0.03)
    assert set(s) == {"mean@4", "std@4", "best@2/mean", "best@2/std", "worst@2/mean", "worst@2/std"} | {
        "best@4/mean",
        "best@4/std",
        "worst@4/mean",
        "worst@4/std",
    }


def test_bootstrap_is_exact_on_constant_values_and_reproducible():
    assert bootstrap_metric([0.5, 0.5, 0.5], k=2) == {"best": (0.5, 0.0), "worst": (0.5, 0.0)}
    assert bootstrap_metric([0.0, 1.0], k=2, seed=7) == bootstrap_metric([0.0, 1.0], k=2, seed=7)
    assert bootstrap_metric([0.0, 1.0], k=2, seed=7) != bootstrap_metric([0.0, 1.0], k=2, seed=8)


def test_majority_value_and_ties():
    assert majority_value([0.0, 1.0, 1.0], ["x", "y", "y"]) == 1.0
    assert majority_value([0.0, 1.0], ["x", "y"]) == 0.0  # tie: the prediction seen first
    assert majority_value([0.3, 0.9, 0.1], ["y", "x", "y"]) == 0.3  # the first 'y' response


def test_maj_at_k_needs_pred_and_string_variables_are_skipped():
    preds = ["7"] * 4 + ["3", "4", "5", "6"] + ["1"]
    out = process_validation_metrics(SOURCES, UIDS, {"acc": ACC, "pred": preds})
    assert "pred" not in out["s"]
    # u1 all predict "7": maj picks the first drawn response; u2 all wrong -> 0
    s = out["s"]["acc"]
    assert s["maj@4/mean"] == pytest.approx(0.75 / 2, abs=0.03)
    assert "maj@4/mean" not in process_validation_metrics(SOURCES, UIDS, {"acc": ACC})["s"]["acc"]


def test_length_mismatch_names_the_variable():
    with pytest.raises(ValueError, match="'acc'"):
        process_validation_metrics(SOURCES, UIDS, {"acc": ACC[:-1]})


def test_flatten_core_is_acc_when_present():
    flat = flatten_validation_metrics(
        process_validation_metrics(SOURCES, UIDS, {"acc": ACC, "reward": REWARD})
    )
    core = {name for name in flat if name.startswith("val-core/")}
    assert core == {
        "val-core/s/acc/mean@4",
        "val-core/s/acc/best@4/mean",
        "val-core/s/acc/best@4/std",
        "val-core/t/acc/mean@1",
    }
    assert flat["val-core/s/acc/mean@4"] == pytest.approx(0.375)
    assert flat["val-aux/s/reward/mean@4"] == pytest.approx((0.5 - 1.0) / 2)
    assert "val-aux/s/acc/best@2/mean" in flat and "val-aux/s/acc/std@4" in flat


def test_flatten_core_is_reward_without_acc():
    flat = flatten_validation_metrics(process_validation_metrics(SOURCES, UIDS, {"reward": REWARD}))
    assert flat["val-core/s/reward/mean@4"] == pytest.approx(-0.25)
    assert flat["val-core/t/reward/mean@1"] == 1.0
