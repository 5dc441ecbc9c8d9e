"""Every policy loss on small hand-computed cases: values, gradients and metrics."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from verl.algorithms import policy_losses
from verl.algorithms.policy_losses import get_policy_loss_fn, register_policy_loss
from verl.config.algorithm import PolicyLossConfig
from verl.config.base import ConfigError

METRIC_KEYS = {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}


def actor_config(loss_mode="vanilla", **overrides):
    policy_loss = PolicyLossConfig(loss_mode=loss_mode)
    for key in [k for k in overrides if hasattr(policy_loss, k)]:
        setattr(policy_loss, key, overrides.pop(key))
    fields = dict(
        clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0, tis_imp_ratio_cap=-1.0
    )
    fields.update(overrides)
    return SimpleNamespace(policy_loss=policy_loss, **fields)


def call(name, old, logp, adv, mask, mode="token-mean", config=None, **kw):
    logp = logp.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(name)(old, logp, adv, mask, mode, config or actor_config(name), **kw)
    assert set(metrics) >= METRIC_KEYS
    loss.backward()
    return loss.detach(), metrics, logp.grad


def logs(*ratios):
    return torch.log(torch.tensor([list(ratios)]))


# ----------------------------------------------------------------------------- registry
def test_unknown_loss_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown policy loss_mode 'nope'.*'cispo'.*'vanilla'"):
        get_policy_loss_fn("nope")


def test_user_registered_loss_is_found_and_validated():
    @register_policy_loss("test_zero_loss")
    def zero_loss(
        old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None
    ):
        return (log_prob * 0).sum(), {}

    try:
        assert get_policy_loss_fn("test_zero_loss") is zero_loss
        PolicyLossConfig(loss_mode="test_zero_loss").validate("actor.policy_loss")
    finally:
        del policy_losses.POLICY_LOSS_REGISTRY["test_zero_loss"]
    with pytest.raises(ConfigError, match=r"actor.policy_loss.loss_mode"):
        PolicyLossConfig(loss_mode="test_zero_loss").validate("actor.policy_loss")


def test_policy_loss_config_checks_ratios():
    with pytest.raises(ConfigError, match="clip_cov_lb"):
        PolicyLossConfig(clip_cov_lb=6.0).validate("p")
    with pytest.raises(ConfigError, match="kl_cov_ratio"):
        PolicyLossConfig(kl_cov_ratio=0.0).validate("p")


# ----------------------------------------------------------------------------- vanilla PPO
OLD4 = torch.zeros(1, 4)
LOGP4 = logs(1.5, 0.5, 1.1, 4.0)
ADV4 = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
MASK4 = torch.ones(1, 4)


def test_vanilla_clip_and_dual_clip():
    loss, metrics, grad = call("vanilla", OLD4, LOGP4, ADV4, MASK4)
    # token 0: max(-1.5, -1.2) = -1.2 (clipped)   token 1: max(-0.5, -0.8) = -0.5
    # token 2: max(1.1, 1.1) = 1.1                 token 3: max(4, 1.2) = 4, dual clip min(4, 3) = 3
    assert_close(loss, torch.tensor((-1.2 - 0.5 + 1.1 + 3.0) / 4))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.25)
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(1.5 * 0.5 * 1.1 * 4.0) / 4)
    # clipped tokens get no gradient; the others get -A * r / 4.
    assert_close(grad, torch.tensor([[0.0, -0.5 / 4, 1.1 / 4, 0.0]]))


def test_vanilla_asymmetric_clip_uses_low_and_high():
    config = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss, _, _ = call("vanilla", OLD4, LOGP4, ADV4, MASK4, config=config)
    # token 0 is now clipped at 1.28; token 3's upper clip would be 1.28 but dual clip still gives 3.
    assert_close(loss, torch.tensor((-1.28 - 0.5 + 1.1 + 3.0) / 4))


def test_vanilla_ignores_padding():
    old = torch.zeros(2, 2)
    logp = torch.log(torch.tensor([[1.0, 50.0], [1.0, 1.0]]))
    adv = torch.tensor([[2.0, 100.0], [-1.0, 7.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss, metrics, grad = call("vanilla", old, logp, adv, mask)
    assert_close(loss, torch.tensor((-2.0 + 1.0) / 2))
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert grad[:, 1].abs().sum() == 0


def test_vanilla_rejects_clip_ratio_c_not_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        call("vanilla", OLD4, LOGP4, ADV4, MASK4, config=actor_config(clip_ratio_c=1.0))


def test_vanilla_multiplies_rollout_importance_weights():
    base, _, _ = call("vanilla", OLD4, LOGP4, ADV4, MASK4)
    weighted, _, grad = call("vanilla", OLD4, LOGP4, ADV4, MASK4, rollout_is_weights=torch.full((1, 4), 2.0))
    assert_close(weighted, 2.0 * base)  # every token loss times its weight (verl 0.9.1's convention)
    assert_close(grad, torch.tensor([[0.0, -0.5 / 2, 1.1 / 2, 0.0]]))


@pytest.mark.parametrize("name", ["vanilla", "gspo", "sapo", "cispo", "gpg", "dro", "dppo_tv", "clip_cov"])
def test_every_token_level_loss_takes_rollout_importance_weights(name):
    config = actor_config(name, dro_beta=0.1)
    config.tau_pos, config.tau_neg = 1.0, 1.05
    weights = torch.tensor([[0.5, 1.0, 2.0, 0.0]])
    torch.manual_seed(0)
    plain, _, _ = call(name, OLD4, LOGP4, ADV4, MASK4, mode="token-sum", config=config)
    torch.manual_seed(0)
    weighted, _, _ = call(
        name, OLD4, LOGP4, ADV4, MASK4, mode="token-sum", config=config, rollout_is_weights=weights
    )
    assert not torch.allclose(plain, weighted)
    torch.manual_seed(0)
    ones, _, _ = call(
        name, OLD4, LOGP4, ADV4, MASK4, mode="token-sum", config=config, rollout_is_weights=torch.ones(1, 4)
    )
    assert_close(ones, plain)


# ----------------------------------------------------------------------------- GSPO
def test_gspo_sequence_ratio():
    old = torch.zeros(2, 2)
    logp = torch.tensor([[math.log(2.0), 0.0], [math.log(1.1), 5.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, metrics, grad = call("gspo", old, logp, adv, mask, mode="seq-mean-token-mean")
    # row 0: s = exp(ln2 / 2) = 1.414 > 1.2, A > 0 -> clipped loss -1.2 on both tokens.
    # row 1: s = exp(ln 1.1 / 1) = 1.1 (padding excluded), A < 0 -> loss 1.1.
    assert_close(loss, torch.tensor((-1.2 + 1.1) / 2))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    # the unclipped row gets d/dlogp (-A * s) = 1.1 per token, / 1 token / 2 rows.
    assert_close(grad, torch.tensor([[0.0, 0.0], [0.55, 0.0]]))
    # verl 0.9.1 honours loss_agg_mode: token-mean weighs the 3 valid tokens equally.
    loss, _, _ = call("gspo", old, logp, adv, mask, mode="token-mean")
    assert_close(loss, torch.tensor((-1.2 - 1.2 + 1.1) / 3))


# ----------------------------------------------------------------------------- GPG, CISPO
def test_gpg_is_plain_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    adv = torch.tensor([[1.0, -2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics, grad = call("gpg", torch.zeros(1, 3), logp, adv, mask)
    assert_close(loss, torch.tensor((1.0 - 4.0) / 2))
    assert_close(grad, torch.tensor([[-0.5, 1.0, 0.0]]))
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_cispo_clips_the_detached_weight():
    logp = logs(1.5, 0.9)
    adv = torch.tensor([[1.0, -1.0]])
    loss, metrics, grad = call("cispo", torch.zeros(1, 2), logp, adv, torch.ones(1, 2))
    # weights clip(1.5) = 1.2 and 0.9; loss = mean(-w * A * log pi).
    expected = (-1.2 * math.log(1.5) + 0.9 * math.log(0.9)) / 2
    assert_close(loss, torch.tensor(expected))
    assert_close(grad, torch.tensor([[-0.6, 0.45]]))  # every token keeps a gradient
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- GMPO
def test_geo_mean_clips_log_ratio_by_advantage_sign():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[0.5, -0.1]])
    # A > 0: log-ratios clamped to [-0.2, 0.2] from above -> [0.2, -0.1], mean 0.05.
    loss, metrics, _ = call("geo_mean", old, logp, torch.ones(1, 2), torch.ones(1, 2))
    assert_close(loss, torch.tensor(-math.exp(0.05)), atol=1e-6, rtol=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    # A < 0: the larger of raw and clamped is kept -> [0.5, -0.1], mean 0.2; loss = +exp(0.2).
    loss, metrics, _ = call("geo_mean", old, logp, -torch.ones(1, 2), torch.ones(1, 2))
    assert_close(loss, torch.tensor(math.exp(0.2)), atol=1e-6, rtol=1e-6)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.5)


# ----------------------------------------------------------------------------- Clip-Cov, KL-Cov
# log pi - mean = [1.5, -1, 0, -0.5], A - mean = [2, -2, 0, 0] -> cov = [3, 2, 0, 0]
COV_LOGP = torch.tensor([[-0.5, -3.0, -2.0, -2.5]])
COV_ADV = torch.tensor([[2.0, -2.0, 0.0, 0.0]])


def test_clip_cov_detaches_the_in_band_token():
    config = actor_config("clip_cov", clip_cov_lb=1.0, clip_cov_ub=2.5, clip_cov_ratio=0.25)
    # ratio 1 everywhere (old = new): PPO clips nothing; only token 1 (cov 2) is in (1, 2.5).
    loss, metrics, grad = call(
        "clip_cov", COV_LOGP.clone(), COV_LOGP, COV_ADV, torch.ones(1, 4), config=config
    )
    assert_close(loss, torch.tensor(-2.0 / 4))  # per-token losses [-2, 2 -> 0, 0, 0]
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)
    assert grad[0, 1] == 0 and grad[0, 0] == pytest.approx(-2.0 / 4)


def test_clip_cov_detaches_clip_num_of_the_candidates():
    config = actor_config("clip_cov", clip_cov_lb=1.0, clip_cov_ub=5.0, clip_cov_ratio=0.25)
    _, metrics, grad = call("clip_cov", COV_LOGP.clone(), COV_LOGP, COV_ADV, torch.ones(1, 4), config=config)
    # tokens 0 and 1 are candidates; max(1, int(0.25 * 4)) = 1 of them is picked at random.
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)
    assert int((grad[0, :2] == 0).sum()) == 1


def test_kl_cov_penalises_the_top_covariance_token():
    config = actor_config("kl_cov", kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    old = COV_LOGP - torch.tensor([[0.1, 0.2, 0.0, 0.0]])
    loss, metrics, _ = call("kl_cov", old, COV_LOGP, COV_ADV, torch.ones(1, 4), config=config)
    # -A r = [-2 e^0.1, 2 e^0.2, 0, 0]; token 0 (cov 3, the largest) adds 0.1 * |0.1|.
    expected = (-2 * math.exp(0.1) + 0.01 + 2 * math.exp(0.2)) / 4
    assert_close(loss, torch.tensor(expected))
    assert metrics["actor/ppo_kl"] == pytest.approx(0.3 / 4)  # mean |log r|
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_rollout_is_weights_token_and_sequence_by_hand():
    from verl.algorithms.rollout_correction import rollout_is_weights

    prox = torch.tensor([[-1.0, -1.0, -2.0], [-0.5, -0.5, 0.0]])
    behav = torch.tensor([[-1.0, -2.0, -2.0], [-1.0, -0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    w, m = rollout_is_weights(prox - behav, mask, "token", 2.0)
    # token ratios: [1, e, pad] and [e^0.5, 1, 1]; e = 2.718 is truncated to 2, padding gets 0
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.0], [math.exp(0.5), 1.0, 1.0]]))
    assert m["rollout_is_mean"] == pytest.approx((1 + 2 + math.exp(0.5) + 1 + 1) / 5)
    w, _ = rollout_is_weights(prox - behav, mask, "sequence", 2.0)
    # sequence ratios: exp(0 + 1) = e -> 2 (row 0; the padded token does not count), exp(0.5) (row 1)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 0.0], [math.exp(0.5)] * 3]))
    w, _ = rollout_is_weights(prox - behav, mask, "token", "0.9_2.0")  # IcePop: outside [0.9, 2] -> 0
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.0], [math.exp(0.5), 1.0, 1.0]]))
    w, m = rollout_is_weights(prox - behav, mask, "token", 2.0, batch_normalize=True)
    mean = (1 + 2 + math.exp(0.5) + 1 + 1) / 5
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.0], [math.exp(0.5), 1.0, 1.0]]) / mean)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(mean)
    with pytest.raises(ValueError, match="rollout_is"):
        rollout_is_weights(prox - behav, mask, "batch", 2.0)


def test_rollout_rejection_by_hand():
    from verl.algorithms.rollout_correction import rollout_rejection_mask

    log_rho = torch.tensor([[0.0, 1.0, 0.0], [0.1, -0.1, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # token_k2: 0.5 * log_rho^2 <= 0.1 rejects only the token with log_rho = 1
    kept, m = rollout_rejection_mask(log_rho, mask, "token_k2", 0.1)
    torch.testing.assert_close(kept, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))
    assert m["rollout_rs_masked_fraction"] == pytest.approx(1 / 5)
    # seq_sum_k1 keeps rows with log(l) <= -sum log_rho <= log(u): row 0 (-1) is out of [log 0.5, log 2]
    kept, _ = rollout_rejection_mask(log_rho, mask, "seq_sum_k1", "0.5_2.0")
    torch.testing.assert_close(kept, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="rollout_rs"):
        rollout_rejection_mask(log_rho, mask, "seq_max_k1", 0.1)
