"""Reward managers used through verl's API: ``@register`` + ``load_reward_manager``, managers built
with a plain scoring function, ``compute_reward`` / ``compute_reward_async``, PRIME's manager and
``default_compute_score``; on hand-made batches tokenized by the built-in character tokenizer."""

from __future__ import annotations

import pytest
import torch

from tests.workers.reward import scorers
from tests.workers.reward.helpers import make_batch
from verl.builtin.task import build_char_tokenizer
from verl.config.ppo_trainer import load_config
from verl.trainer.ppo.reward import compute_reward, compute_reward_async, load_reward_manager
from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager import (
    AbstractRewardManager,
    NaiveRewardManager,
    PrimeRewardManager,
    get_reward_manager_cls,
    register,
    registry,
)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture
def batch(tok):
    """Two rows: "2" for "2" (one matching digit) and "125" for "12" (two); each response ends in EOS."""
    return make_batch(tok, ["1+1=", "6+6="], ["2", "125"], ["2", "12"], data_source="arith", response_len=4)


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # undone after the test


def test_a_manager_registered_with_verls_decorator_is_what_load_reward_manager_builds(
    tok, batch, scratch_registry
):
    @register("my_rm")
    class MyRewardManager(AbstractRewardManager):
        """Written against verl's interface: no pool arguments, a plain compute_score."""

        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source"):
            self.num_examine, self.compute_score, self.reward_fn_key = (
                num_examine,
                compute_score,
                reward_fn_key,
            )

        def __call__(self, data, return_dict=False):
            sources = data.non_tensor_batch[self.reward_fn_key]
            scores = torch.tensor([self.compute_score(s, "2", "2") for s in sources])
            return {"reward_tensor": scores, "reward_extra_info": {}} if return_dict else scores

    config = load_config(["reward_model.reward_manager=my_rm", "reward_model.scoring.num_workers=0"])
    manager = load_reward_manager(config, tok, num_examine=0)
    assert type(manager) is MyRewardManager and get_reward_manager_cls("my_rm") is MyRewardManager
    assert manager.num_examine == 0 and manager.reward_fn_key == "data_source"
    # without a custom function it gets the built-in scorers as a plain function (arith: exact match)
    assert manager.compute_score("arith", "7", "7") == 1.0 and manager.compute_score("arith", "7", "8") == 0.0
    assert manager(batch).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="already registered"):
        register("my_rm")(NaiveRewardManager)


def test_naive_manager_scores_with_a_plain_function_on_each_last_response_token(tok, batch):
    manager = NaiveRewardManager(tok, 0, compute_score=scorers.digits_score)
    out = manager(batch, return_dict=True)
    expected = torch.zeros(2, 4)
    expected[0, 1], expected[1, 3] = 0.1, 0.2  # "2"+EOS ends at 1, "125"+EOS at 3
    torch.testing.assert_close(out["reward_tensor"], expected)
    assert out["reward_extra_info"]["score"] == pytest.approx([0.1, 0.2])
    torch.testing.assert_close(manager(batch), expected)


def test_a_closure_runs_in_process_and_is_refused_for_scorer_processes_with_the_fix(tok, batch):
    bonus = 0.5
    manager = NaiveRewardManager(tok, 0, compute_score=lambda data_source, solution_str, **_: bonus)
    assert manager(batch).sum(-1).tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match=r"cannot be sent to scorer processes.*module-level function"):
        NaiveRewardManager(tok, 0, compute_score=lambda **_: bonus, num_workers=1)


def test_compute_reward_returns_the_tensor_and_the_extra_info(tok, batch):
    reward_tensor, extra = compute_reward(
        batch, NaiveRewardManager(tok, 0, compute_score=scorers.digits_score)
    )
    assert reward_tensor.sum(-1).tolist() == pytest.approx([0.1, 0.2])
    assert extra["score"] == pytest.approx([0.1, 0.2]) and extra["acc"] == pytest.approx([0.1, 0.2])

    def plain_reward_fn(data):  # no return_dict: called as reward_fn(data), no extra info
        return torch.ones_like(data.batch["responses"], dtype=torch.float32)

    reward_tensor, extra = compute_reward(batch, plain_reward_fn)
    assert reward_tensor.sum().item() == 8.0 and extra == {}


def test_prime_scores_in_processes_keeps_a_tuples_score_zeroes_a_hung_call_and_stores_acc(tok):
    data = make_batch(tok, ["1+1=", "2+2="], ["2", "99"], ["2", "4"], data_source="arith", response_len=4)
    manager = PrimeRewardManager(tok, 0, compute_score=scorers.prime_score, num_workers=1, timeout_s=2.0)
    try:
        out = manager(data, return_dict=True)
    finally:
        manager.close()
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert data.batch["acc"].tolist() == [1.0, 0.0]
    assert out["reward_metrics"]["reward/timeouts"] == 1


def test_prime_defaults_to_parallel_processes_with_verls_300_second_timeout(tok):
    manager = PrimeRewardManager(tok, 0)
    assert 1 <= manager.num_workers <= 64 and manager.timeout_s == 300.0 and manager.spec.kind == "default"


def test_default_compute_score_takes_verls_arguments():
    assert default_compute_score("arith", "7", "7") == 1.0
    assert default_compute_score("arith", "7", "8", extra_info={"index": 0}) == 0.0


@pytest.mark.slow
def test_compute_reward_async_gives_the_same_tuple_from_a_ray_task(ray_session, tok, batch):
    import ray

    manager = NaiveRewardManager(tok, 0, compute_score=scorers.digits_score)
    reward_tensor, extra = ray.get(compute_reward_async.remote(batch, reward_fn=manager))
    expected, expected_extra = compute_reward(batch, manager)
    torch.testing.assert_close(reward_tensor, expected)
    assert extra["score"] == pytest.approx(expected_extra["score"])
