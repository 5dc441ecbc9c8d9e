import pytest
import torch

from tests.utils.dataset.char_tokenizer import make_char_tokenizer
from tests.workers.reward import scorers
from tests.workers.reward.helpers import make_batch
from verl.config.reward import OverlongBufferConfig
from verl.utils.reward_score import UnknownDataSourceError
from verl.utils.reward_score.scorer_process import ScorerSpec
from verl.workers.reward_manager import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    overlong_penalty,
)

FILE_SPEC = ScorerSpec(kind="file", path=scorers.__file__, name="compute_score")
BATCH_SPEC = ScorerSpec(kind="file", path=scorers.__file__, name="batch_score")


@pytest.fixture(scope="module")
def tok():
    return make_char_tokenizer()


def test_naive_places_score_on_last_valid_token(tok):
    data = make_batch(tok, ["1+1=", "2+2="], ["2", "13"], ["2", "4"], data_source="arith")
    manager = NaiveRewardManager(tok)
    out = manager(data, return_dict=True)
    expected = torch.zeros(2, 8)
    expected[0, 1] = 1.0  # "2" + EOS: two valid tokens, the score sits on the EOS
    assert torch.equal(out["reward_tensor"], expected)
    assert out["reward_extra_info"] == {"score": [1.0, 0.0], "acc": [1.0, 0.0]}
    assert out["reward_metrics"] == {"reward/errors": 0, "reward/timeouts": 0}
    assert torch.equal(manager(data), expected)  # return_dict=False: the tensor only


def test_response_filling_the_whole_length(tok):
    data = make_batch(tok, ["1+1="], ["12345678"], ["12345678"], data_source="arith", eos=False)
    reward = NaiveRewardManager(tok)(data)
    assert reward[0, 7] == 1.0 and reward.sum() == 1.0


def test_special_tokens_are_skipped_before_scoring(tok):
    data = make_batch(tok, ["1+1="], ["2"], ["2"], data_source="arith", eos=True)
    assert NaiveRewardManager(tok)(data).sum() == 1.0  # "2<eos>" decodes to "2"


def test_failures_score_zero_and_are_counted(tok):
    texts = ["a", "raise", "hang", "nan", "text", "die", "dict", "b"]
    data = make_batch(tok, ["p"] * 8, texts, ["a"] * 8)
    manager = NaiveRewardManager(tok, compute_score=FILE_SPEC, num_workers=1, timeout_s=0.5)
    try:
        out = manager(data, return_dict=True)
    finally:
        manager.close()
    lengths = [len(t) + 1 for t in texts]
    rewards = [out["reward_tensor"][i, n - 1].item() for i, n in enumerate(lengths)]
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0]
    assert out["reward_metrics"] == {"reward/errors": 4, "reward/timeouts": 1}  # raise, nan, text, die; hang
    info = out["reward_extra_info"]
    assert info["acc"] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # the dict row reports acc=False
    assert info["pred"] == [None] * 6 + ["x", None]
    assert all(len(v) == 8 for v in info.values())


def test_inline_mode_counts_errors_too(tok):
    data = make_batch(tok, ["p", "p"], ["raise", "a"], ["a", "a"])
    out = NaiveRewardManager(tok, compute_score=scorers.compute_score)(data, return_dict=True)
    assert out["reward_metrics"] == {"reward/errors": 1, "reward/timeouts": 0}
    assert out["reward_extra_info"]["score"] == [0.0, 1.0]


def test_unknown_data_source_at_scoring_is_an_error_not_a_crash(tok):
    data = make_batch(tok, ["p"], ["x"], ["x"], data_source="nobody")
    out = NaiveRewardManager(tok)(data, return_dict=True)
    assert out["reward_metrics"]["reward/errors"] == 1


def test_rm_scores_are_returned_unchanged(tok):
    data = make_batch(tok, ["p"], ["a"], ["a"])
    data.batch["rm_scores"] = torch.full((1, 8), 0.25)
    out = NaiveRewardManager(tok)(data, return_dict=True)
    assert torch.equal(out["reward_tensor"], torch.full((1, 8), 0.25))


def test_check_data_sources(tok):
    manager = NaiveRewardManager(tok)
    manager.check_data_sources({"arith": "train.parquet, row 0"})
    with pytest.raises(UnknownDataSourceError, match=r"train.parquet, row 4, column 'data_source'.*'mine'"):
        manager.check_data_sources({"arith": "x", "mine": "train.parquet, row 4"})
    NaiveRewardManager(tok, compute_score=scorers.compute_score).check_data_sources({"mine": "x"})


def test_batch_manager_default_and_custom(tok):
    data = make_batch(tok, ["1+1=", "1+1="], ["2", "3"], ["2", "2"], data_source="arith")
    assert BatchRewardManager(tok)(data, return_dict=True)["reward_extra_info"]["score"] == [1.0, 0.0]
    manager = BatchRewardManager(tok, compute_score=BATCH_SPEC, num_workers=1, timeout_s=0.5)
    try:
        assert manager(data, return_dict=True)["reward_extra_info"]["score"] == [2.0, 0.0]
        hung = manager(make_batch(tok, ["p", "p"], ["hang", "a"], ["a", "a"]), return_dict=True)
        assert hung["reward_metrics"] == {"reward/errors": 0, "reward/timeouts": 2}
        short = manager(make_batch(tok, ["p", "p"], ["short", "a"], ["a", "a"]), return_dict=True)
        assert short["reward_metrics"]["reward/errors"] == 2
        assert short["reward_tensor"].sum() == 0
    finally:
        manager.close()


def test_overlong_penalty_formula():
    # max 10, buffer 4: no penalty up to 6 tokens, then -(len - 6) / 4 * factor
    lengths = torch.tensor([3, 6, 7, 8, 10])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]) * 2.0
    assert torch.allclose(overlong_penalty(lengths, 10, 4, 2.0), expected)


def test_dapo_adds_the_penalty(tok):
    # responses of 2, 5 and 8 valid tokens (text + EOS); max_resp_len 8, buffer 4 -> expected_len 4
    data = make_batch(
        tok, ["1+1="] * 3, ["2", "2222", "2222222"], ["2", "2222", "2222222"], data_source="arith"
    )
    cfg = OverlongBufferConfig(enable=True, len=4, penalty_factor=1.0, log=True)
    out = DAPORewardManager(tok, max_resp_len=8, overlong_buffer_cfg=cfg)(data, return_dict=True)
    rewards = [
        out["reward_tensor"][0, 1].item(),
        out["reward_tensor"][1, 4].item(),
        out["reward_tensor"][2, 7].item(),
    ]
    assert rewards == pytest.approx([1.0, 1.0 - 0.25, 1.0 - 1.0])
    assert out["reward_extra_info"]["overlong_reward"] == pytest.approx([0.0, -0.25, -1.0])
    assert out["reward_extra_info"]["overlong"] == [False, True, True]
    assert out["reward_extra_info"]["score"] == [1.0, 1.0, 1.0]


def test_dapo_without_buffer_is_naive(tok):
    data = make_batch(tok, ["1+1="], ["2222222"], ["2222222"], data_source="arith")
    assert DAPORewardManager(tok, max_resp_len=8)(data).sum() == 1.0


def test_dapo_rejects_a_buffer_longer_than_the_response(tok):
    from verl.config.base import ConfigError

    with pytest.raises(ConfigError, match=r"reward_model.overlong_buffer.len"):
        DAPORewardManager(tok, max_resp_len=8, overlong_buffer_cfg=OverlongBufferConfig(enable=True, len=9))


def test_manager_pickles_without_its_processes(tok):
    import pickle

    manager = NaiveRewardManager(tok, compute_score=FILE_SPEC, num_workers=1)
    data = make_batch(tok, ["p"], ["a"], ["a"])
    try:
        assert manager(data).sum() == 1.0  # starts the pool
        copy = pickle.loads(pickle.dumps(manager))
    finally:
        manager.close()
    try:
        assert copy._pool is None and copy(data).sum() == 1.0
    finally:
        copy.close()


def test_bool_and_numpy_scores_are_numbers(tok):
    import numpy as np

    data = make_batch(tok, ["p", "p"], ["a", "b"], ["a", "a"])
    verdicts = iter([True, np.float32(0.25)])
    out = NaiveRewardManager(tok, compute_score=lambda **kw: next(verdicts))(data, return_dict=True)
    assert out["reward_extra_info"]["score"] == [1.0, 0.25]
    assert out["reward_metrics"]["reward/errors"] == 0


def test_failures_are_logged_once_per_batch(tok, caplog):
    data = make_batch(tok, ["p"] * 3, ["raise", "raise", "a"], ["a"] * 3)
    with caplog.at_level("WARNING", logger="verl.workers.reward_manager.base"):
        NaiveRewardManager(tok, compute_score=scorers.compute_score)(data)
    records = [r for r in caplog.records if r.name == "verl.workers.reward_manager.base"]
    assert len(records) == 1
    assert "2 errors and 0 timeouts in 3 scorer calls" in records[0].getMessage()
    assert "scorer exploded" in records[0].getMessage()


def test_unpicklable_scorer_with_processes_fails_at_construction(tok):
    with pytest.raises(ValueError, match="num_workers=0"):
        NaiveRewardManager(tok, compute_score=lambda **kw: 1.0, num_workers=1)
