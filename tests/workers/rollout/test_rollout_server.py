"""Server mode on the hf engine: continuous batching, per-token versions, pause/resume.

Runs are bounded by engine steps (``resume(steps=k)``), never by wall-clock time, so the
tests hold on a busy machine.
"""

from __future__ import annotations

import pytest
import torch

from tests.workers.rollout.test_hf_rollout import make_rollout
from verl.workers.rollout.hf_engine import HFStepEngine
from verl.workers.rollout.sampling import SamplingParams
from verl.workers.rollout.server import GenerationRequest, RolloutServer

TIMEOUT = 120  # only catches a hang


def params(max_tokens: int, ignore_eos: bool = True, temperature: float = 1.0) -> SamplingParams:
    return SamplingParams(True, temperature, -1, 1.0, max_tokens, ignore_eos, False)


@pytest.fixture(scope="module")
def served(builtin_assets):
    rollout, tokenizer = make_rollout(builtin_assets, response_length=32)
    server = RolloutServer(HFStepEngine(rollout, max_num_seqs=16))
    yield server, rollout, tokenizer
    server.close()


def prompt(tokenizer, text: str = "3+4=") -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_short_requests_finish_before_long_ones_sent_earlier(served):
    server, _, tokenizer = served
    lengths = [24, 2, 12, 1, 6]
    order: list[int] = []
    server.pause()
    futures = [
        server.submit(GenerationRequest(prompt(tokenizer), params(n), seed=i)) for i, n in enumerate(lengths)
    ]
    for i, future in enumerate(futures):
        future.add_done_callback(lambda _, i=i: order.append(i))
    server.resume()
    completions = [f.result(TIMEOUT) for f in futures]
    assert order == [3, 1, 4, 2, 0]  # by length, not by arrival
    assert [len(c.token_ids) for c in completions] == lengths
    assert all(c.finish_reason == "length" for c in completions)


def test_a_seeded_request_samples_the_same_tokens_alone_or_in_a_crowd(served):
    server, _, tokenizer = served
    alone = server.submit(GenerationRequest(prompt(tokenizer), params(10), seed=7)).result(TIMEOUT)
    crowd = [GenerationRequest(prompt(tokenizer, f"{i}+{i}="), params(4 + i), seed=100 + i) for i in range(6)]
    server.pause()
    futures = [server.submit(r) for r in crowd[:3]]
    again = server.submit(GenerationRequest(prompt(tokenizer), params(10), seed=7))
    futures += [server.submit(r) for r in crowd[3:]]
    server.resume()
    assert again.result(TIMEOUT).token_ids == alone.token_ids
    assert all(len(f.result(TIMEOUT).token_ids) == 4 + i for i, f in enumerate(futures))


def test_a_weight_update_mid_generation_changes_versions_inside_the_sequence(served):
    server, rollout, tokenizer = served
    start = rollout.version
    old = {k: v.clone() for k, v in rollout.module.state_dict().items()}
    new = {
        k: v + 0.02 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) for k, v in old.items()
    }
    server.pause()
    future = server.submit(GenerationRequest(prompt(tokenizer), params(12), seed=3))
    server.resume(steps=4)
    server.wait_paused(TIMEOUT)
    assert not future.done() and server.stats()["running"] == 1
    server.update_weights(new.items(), start + 1)
    server.resume()
    c = future.result(TIMEOUT)
    assert c.versions == [start] * 4 + [start + 1] * 8
    assert len(c.token_ids) == 12 and c.prompt_ids == prompt(tokenizer)
    # the tokens after the update were decoded under the new weights (KV cache recomputed)
    scored = server.sequence_log_probs(c.prompt_ids + c.token_ids)[-12:]
    assert torch.allclose(torch.tensor(c.log_probs[4:]), scored[4:], atol=1e-4)
    assert not torch.allclose(torch.tensor(c.log_probs[:4]), scored[:4], atol=1e-4)
    server.update_weights(old.items(), start + 2)


def test_nothing_is_lost_across_pause_and_resume(served):
    server, _, tokenizer = served
    server.pause()
    futures = [server.submit(GenerationRequest(prompt(tokenizer), params(8 + i), seed=i)) for i in range(6)]
    server.resume(steps=3)
    server.wait_paused(TIMEOUT)
    stats = server.stats()
    assert stats["paused"] == 1 and stats["running"] == 6
    assert not any(f.done() for f in futures)
    server.resume()
    assert [len(f.result(TIMEOUT).token_ids) for f in futures] == [8 + i for i in range(6)]
    assert server.stats()["running"] == 0


def test_requests_stop_at_eos_and_abort_returns_what_was_generated(served):
    server, rollout, tokenizer = served
    eos = set(rollout.eos_token_ids.tolist())
    stopped = server.submit(GenerationRequest(prompt(tokenizer), params(32, ignore_eos=False), seed=0))
    c = stopped.result(TIMEOUT)
    assert c.finish_reason == "stop" and c.token_ids[-1] in eos
    assert not eos & set(c.token_ids[:-1])
    server.pause()
    request = GenerationRequest(prompt(tokenizer), params(30), seed=1)
    future = server.submit(request)
    server.resume(steps=2)
    server.wait_paused(TIMEOUT)
    server.abort(request.request_id)
    aborted = future.result(TIMEOUT)
    assert aborted.finish_reason == "abort" and len(aborted.token_ids) == 2
    server.resume()


def test_a_bad_request_fails_alone(served):
    server, _, tokenizer = served
    bad = server.submit(GenerationRequest([10**9], params(4), seed=0))
    good = server.submit(GenerationRequest(prompt(tokenizer), params(4), seed=0))
    with pytest.raises(ValueError, match="token ids in"):
        bad.result(TIMEOUT)
    assert len(good.result(TIMEOUT).token_ids) == 4
