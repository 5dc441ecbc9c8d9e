"""rollout_corr/* metrics: every name verl 0.9.1 reports, each value equal to a direct computation.

The references below are written from the definitions (verl's ``rollout_corr_helper.py``, 0.9.1)
row by row over the valid tokens, not from our implementation: a batch with padding (garbage
log-probs there), one single-token row and one empty row, in float64. Empty rows follow verl:
they count in ``rollout_is_seq_*``, the perplexities and ``rollout_rs_seq_masked_fraction`` (with
weight 0 and log-perplexity 0), and are left out of the per-option ``rollout_rs_*_seq_*``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.trainer.ppo.verl_reference import cases
from verl.algorithms.rollout_correction import compute_rollout_correction_and_rejection_mask

OFFPOLICY_NAMES = {
    "training_ppl",
    "training_log_ppl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
    "kl",
    "k3_kl",
    "chi2_token",
    "chi2_seq",
}
IS_NAMES = {
    "rollout_is_mean",
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_std",
    "rollout_is_eff_sample_size",
    "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low",
    "rollout_is_seq_mean",
    "rollout_is_seq_std",
    "rollout_is_seq_max",
    "rollout_is_seq_min",
    "rollout_is_seq_max_deviation",
    "rollout_is_seq_fraction_high",
    "rollout_is_seq_fraction_low",
}
RS_OPTION_SUFFIXES = {
    "mean",
    "max",
    "min",
    "std",
    "fraction_high",
    "fraction_low",
    "seq_mean",
    "seq_std",
    "seq_max",
    "seq_min",
    "seq_max_deviation",
    "seq_fraction_high",
    "masked_fraction",
    "seq_masked_fraction",
}
"""Per ``rollout_rs`` option, as ``rollout_rs_<option>_<suffix>``; ``*_k1`` options add ``seq_fraction_low``."""
RS_SUMMARY_NAMES = {"rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction"}
LENGTHS = [7, 3, 0, 5, 1, 6, 4]
RECORDED = Path(__file__).parent / "verl_reference" / "verl091_outputs.pt"


def expected_names(is_on: bool = False, norm: bool = False, icepop: bool = False, rs: tuple = ()) -> set:
    names = set(OFFPOLICY_NAMES) | (IS_NAMES if is_on else set())
    names |= {"rollout_is_batch_norm_factor"} if norm else set()
    names |= {"rollout_is_oob_ratio"} if icepop else set()
    for option in rs:
        suffixes = RS_OPTION_SUFFIXES | ({"seq_fraction_low"} if option.endswith("k1") else set())
        names |= {f"rollout_rs_{option}_{s}" for s in suffixes}
    names |= RS_SUMMARY_NAMES if rs else set()
    return {f"rollout_corr/{n}" for n in names}


@pytest.fixture
def batch():
    gen = torch.Generator().manual_seed(7)
    mask = torch.zeros(len(LENGTHS), 7, dtype=torch.float64)
    for i, n in enumerate(LENGTHS):
        mask[i, :n] = 1.0
    old = -torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 3.0
    rollout = old - 0.45 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    pad = mask == 0
    old[pad], rollout[pad] = 5.0, -30.0  # a metric that forgets the mask sees log_rho = 35
    return old, rollout, mask


def run(batch, **settings):
    old, rollout, mask = batch
    return compute_rollout_correction_and_rejection_mask(old, rollout, mask, **settings)


def check(metrics: dict, reference: dict) -> None:
    for name, value in reference.items():
        assert metrics[f"rollout_corr/{name}"] == pytest.approx(value, rel=1e-6, abs=1e-6), name


def valid_rows(batch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(log pi_old, log pi_rollout)`` over the valid tokens of each row (empty for an empty row)."""
    old, rollout, mask = batch
    return [(old[i][mask[i].bool()], rollout[i][mask[i].bool()]) for i in range(len(mask))]


def mean_or_zero(values: torch.Tensor) -> float:
    return values.mean().item() if values.numel() else 0.0


def fraction(flags: list[bool]) -> float:
    return sum(flags) / len(flags)


# ----------------------------------------------------------------------------- references
def offpolicy_reference(batch) -> dict:
    rows = valid_rows(batch)
    train = torch.tensor([-mean_or_zero(o) for o, _ in rows])
    roll = torch.tensor([-mean_or_zero(r) for _, r in rows])
    diff = train - roll
    log_rho = torch.cat([o - r for o, r in rows])
    seq_sum = torch.tensor([(o - r).sum().item() for o, r in rows]).clamp(-20, 20)
    return {
        "training_ppl": train.exp().mean().item(),
        "training_log_ppl": train.mean().item(),
        "rollout_ppl": roll.exp().mean().item(),
        "rollout_log_ppl": roll.mean().item(),
        "log_ppl_diff": diff.mean().item(),
        "log_ppl_abs_diff": diff.abs().mean().item(),
        "log_ppl_diff_max": diff.max().item(),
        "log_ppl_diff_min": diff.min().item(),
        "ppl_ratio": diff.exp().mean().item(),
        "kl": (-log_rho).mean().item(),
        "k3_kl": (log_rho.exp() - log_rho - 1).mean().item(),
        "chi2_token": (log_rho.exp() ** 2).mean().item() - 1,
        "chi2_seq": (2 * seq_sum).exp().mean().item() - 1,
    }


def is_reference(batch, level: str, upper: float, lower: float | None = None) -> tuple[list, dict]:
    """Per-row ``(raw, applied)`` weights on the valid tokens and the ``rollout_is_*`` values."""
    low = 1 / upper if lower is None else lower
    rows, seq_log = [], []
    for old, roll in valid_rows(batch):
        log_rho = old - roll
        seq_log.append(log_rho.sum().item())
        raw = (log_rho.clamp(-20, 20) if level == "token" else torch.full_like(log_rho, seq_log[-1])).exp()
        raw = raw.clamp(max=math.exp(20))
        applied = (
            raw.clamp(max=upper) if lower is None else torch.where((raw >= low) & (raw <= upper), raw, 0.0)
        )
        rows.append((raw, applied))
    raw_all, w = torch.cat([r for r, _ in rows]), torch.cat([a for _, a in rows])
    row_mean = torch.tensor([mean_or_zero(a) for _, a in rows])
    raw_row_mean = [mean_or_zero(r) for r, _ in rows]
    ref = {
        "rollout_is_mean": w.mean().item(),
        "rollout_is_std": w.std(unbiased=False).item(),
        "rollout_is_eff_sample_size": 1 / ((w / w.mean()) ** 2).mean().item(),
        "rollout_is_seq_mean": row_mean.mean().item(),
        "rollout_is_seq_std": row_mean.std().item(),
        "rollout_is_seq_max": row_mean.max().item(),
        "rollout_is_seq_min": row_mean.min().item(),
        "rollout_is_seq_max_deviation": (row_mean - 1).abs().max().item(),
        "rollout_is_seq_fraction_high": fraction([m > upper for m in raw_row_mean]),
        "rollout_is_seq_fraction_low": fraction([m < low for m in raw_row_mean]),
    }
    if level == "sequence":  # from the unclamped row sums, over every row
        ref["rollout_is_max"] = math.exp(min(max(seq_log), 20))
        ref["rollout_is_min"] = math.exp(min(seq_log))
        ref["rollout_is_ratio_fraction_high"] = fraction([s > math.log(upper) for s in seq_log])
        ref["rollout_is_ratio_fraction_low"] = fraction([s < math.log(low) for s in seq_log])
    else:
        ref["rollout_is_max"], ref["rollout_is_min"] = w.max().item(), w.min().item()
        ref["rollout_is_ratio_fraction_high"] = (raw_all > upper).double().mean().item()
        ref["rollout_is_ratio_fraction_low"] = (raw_all < low).double().mean().item()
    if lower is not None:
        ref["rollout_is_oob_ratio"] = ((raw_all < low) | (raw_all > upper)).double().mean().item()
    return rows, ref


def rs_option_reference(batch, option: str, bounds: tuple) -> tuple[list, dict]:
    """Per-row keep flags of one option on the valid tokens and its ``rollout_rs_<option>_*`` values."""
    level, kind = option.rsplit("_", 1)
    lo, hi = (math.log(bounds[0]), math.log(bounds[1])) if kind == "k1" else (None, bounds[1])
    tokens, keeps, row_stats = [], [], []
    for old, roll in valid_rows(batch):
        x = (old - roll).clamp(-20, 20)
        d = {"k1": -x, "k2": x**2 / 2, "k3": x.exp() - 1 - x}[kind]
        if level != "token" and d.numel():
            d = torch.full_like(d, getattr(d, level.removeprefix("seq_"))().item())
        keeps.append((d <= hi) & (d >= lo) if lo is not None else d <= hi)
        tokens.append(d)
        if d.numel():
            row_stats.append(d.mean().item())  # = the row statistic for seq_* options
    d, seq = torch.cat(tokens), torch.tensor(row_stats)
    over = seq if level != "token" else d  # what max/min/fractions run over
    p = f"rollout_rs_{option}_"
    ref = {
        p + "mean": d.mean().item(),
        p + "max": over.max().item(),
        p + "min": over.min().item(),
        p + "fraction_high": (over > hi).double().mean().item(),
        p + "fraction_low": (over < lo).double().mean().item() if lo is not None else 0.0,
        p + "std": d.clamp(lo if lo is not None else 0.0, hi).std(unbiased=False).item(),
        p + "seq_mean": seq.mean().item(),
        p + "seq_std": seq.std().item(),
        p + "seq_max": seq.max().item(),
        p + "seq_min": seq.min().item(),
        p + "seq_max_deviation": seq.abs().max().item(),
        p + "seq_fraction_high": (seq > hi).double().mean().item(),
        p + "masked_fraction": 1 - torch.cat(keeps).double().mean().item(),
        p + "seq_masked_fraction": fraction([not k.all() for k in keeps if k.numel()]),
    }
    if lo is not None:
        ref[p + "seq_fraction_low"] = (seq < lo).double().mean().item()
    return keeps, ref


# ----------------------------------------------------------------------------- tests
def test_the_batch_exercises_truncation_and_padding(batch):
    rows, _ = is_reference(batch, "token", 1.5)
    raw = torch.cat([r for r, _ in rows])
    assert (raw > 1.5).any() and (raw < 1 / 1.5).any() and (raw <= 1.5).any()
    assert 0 in LENGTHS and 1 in LENGTHS


def test_off_policy_metrics_are_reported_without_any_correction(batch):
    _, mask, metrics = run(batch, rollout_is=None)
    assert set(metrics) == expected_names()
    check(metrics, offpolicy_reference(batch))
    assert torch.equal(mask, batch[2])


@pytest.mark.parametrize("level, upper", [("token", 1.5), ("sequence", 2.0)])
def test_truncated_weight_statistics_match_a_direct_computation(batch, level, upper):
    weights, _, metrics = run(batch, rollout_is=level, rollout_is_threshold=upper)
    rows, ref = is_reference(batch, level, upper)
    assert set(metrics) == expected_names(is_on=True)
    check(metrics, {**ref, **offpolicy_reference(batch)})
    assert torch.allclose(weights[batch[2].bool()], torch.cat([a for _, a in rows]))
    assert metrics["rollout_corr/rollout_is_max"] > upper or level == "token"


@pytest.mark.parametrize("level, spec", [("token", "0.6_1.6"), ("sequence", "0.3_3.0")])
def test_icepop_weights_report_the_out_of_bounds_ratio(batch, level, spec):
    lower, upper = (float(v) for v in spec.split("_"))
    _, _, metrics = run(batch, rollout_is=level, rollout_is_threshold=spec)
    _, ref = is_reference(batch, level, upper, lower)
    assert set(metrics) == expected_names(is_on=True, icepop=True)
    check(metrics, ref)
    assert 0 < ref["rollout_is_oob_ratio"] < 1


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_batch_normalisation_reports_its_factor_and_statistics_before_it(batch, level):
    weights, _, metrics = run(
        batch, rollout_is=level, rollout_is_threshold=1.5, rollout_is_batch_normalize=True
    )
    rows, ref = is_reference(batch, level, 1.5)
    applied = [a for _, a in rows]
    if level == "token":
        factor = torch.cat(applied).mean().item()
    else:
        factor = torch.tensor([a[0].item() for a in applied if a.numel()]).mean().item()
    assert set(metrics) == expected_names(is_on=True, norm=True)
    check(metrics, {**ref, "rollout_is_batch_norm_factor": factor})
    assert torch.allclose(weights[batch[2].bool()], torch.cat(applied) / factor)


@pytest.mark.parametrize(
    "options, spec",
    [
        (("token_k1", "seq_mean_k3"), "0.7_1.4,0.08"),
        (("seq_sum_k1", "seq_max_k2"), "0.2_5.0,0.3"),
        (("token_k3", "seq_sum_k2"), "0.05,0.4"),
    ],
)
def test_each_combined_rejection_option_reports_its_own_statistics(batch, options, spec):
    entries = spec.split(",")
    keeps, ref = [], {}
    for option, entry in zip(options, entries, strict=True):
        bounds = tuple(float(v) for v in entry.split("_")) if "_" in entry else (None, float(entry))
        option_keeps, option_ref = rs_option_reference(batch, option, bounds)
        keeps.append(option_keeps)
        ref.update(option_ref)
        assert 0 < option_ref[f"rollout_rs_{option}_masked_fraction"] < 1, option  # each option acts
    both = [a & b for a, b in zip(*keeps, strict=True)]
    ref["rollout_rs_masked_fraction"] = 1 - torch.cat(both).double().mean().item()
    ref["rollout_rs_seq_masked_fraction"] = fraction([not k.all() for k in both])  # empty rows count
    _, mask, metrics = run(batch, rollout_rs=",".join(options), rollout_rs_threshold=spec)
    assert set(metrics) == expected_names(rs=options)
    check(metrics, {**ref, **offpolicy_reference(batch)})
    assert torch.equal(mask[batch[2].bool()], torch.cat(both).double())


def test_weights_and_rejection_together_report_both_families(batch):
    _, _, metrics = run(
        batch, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k2", rollout_rs_threshold=0.1
    )
    assert set(metrics) == expected_names(is_on=True, rs=("token_k2",))
    check(metrics, is_reference(batch, "token", 2.0)[1])
    check(metrics, rs_option_reference(batch, "token_k2", (None, 0.1))[1])


@pytest.mark.skipif(not RECORDED.exists(), reason="verl 0.9.1's recorded outputs are not in this checkout")
def test_every_recorded_case_reports_exactly_verls_metric_names():
    """The names verl 0.9.1 itself returned on the parity cases (``verl_reference/record_verl.py``)."""
    recorded = torch.load(RECORDED, weights_only=False)
    x = recorded["inputs"]
    corr_cases = [c for c in cases.ALL_CASES if c["kind"] == "corr"]
    assert corr_cases
    for case in corr_cases:
        _, _, metrics = compute_rollout_correction_and_rejection_mask(
            x["old_log_probs"], x["rollout_log_probs"], x["response_mask"], **case["settings"]
        )
        assert set(metrics) == set(recorded["results"][case["id"]]["metrics"]), case["id"]
