"""``actor.entropy_from_logits_with_chunking`` and ``actor.entropy_checkpointing`` change memory, not
values: the chunked and the checkpointed entropy equal the plain one, and so do their gradients. So
do the metric-only entropy (``entropy_coeff=0``) and the log-probs computed a few rows at a time."""

from __future__ import annotations

import pytest
import torch

from verl.utils.torch_functional import entropy_from_logits, entropy_from_logits_chunked
from verl.workers.forward import EntropyOptions, response_entropy, response_log_probs


def _logits(requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(3, 7, 11, generator=torch.Generator().manual_seed(0), requires_grad=requires_grad)


@pytest.mark.parametrize("chunk_size", [1, 4, 21, 100])
def test_chunked_entropy_equals_the_plain_one(chunk_size):
    logits = _logits()
    chunked = entropy_from_logits_chunked(logits, chunk_size)
    assert chunked.shape == (3, 7)
    torch.testing.assert_close(chunked, entropy_from_logits(logits), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "options", [EntropyOptions(chunk_size=5), EntropyOptions(checkpointing=True), EntropyOptions(5, True)]
)
def test_entropy_options_keep_values_and_gradients(options):
    plain_in, other_in = _logits(True), _logits(True)
    plain, other = response_entropy(plain_in, EntropyOptions()), response_entropy(other_in, options)
    torch.testing.assert_close(other, plain, rtol=0, atol=1e-6)
    plain.pow(2).sum().backward()
    other.pow(2).sum().backward()
    torch.testing.assert_close(other_in.grad, plain_in.grad, rtol=1e-6, atol=1e-6)


def _saved_elements(options: EntropyOptions) -> int:
    """Elements autograd keeps for backward while the entropy of a fresh leaf is computed."""
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    logits = _logits(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        response_entropy(logits, options)
    return sum(saved)


def test_entropy_checkpointing_keeps_only_the_logits_for_backward():
    plain, checkpointed = (
        _saved_elements(EntropyOptions()),
        _saved_elements(EntropyOptions(checkpointing=True)),
    )
    assert checkpointed == _logits().numel() < plain


def test_a_metric_only_entropy_keeps_nothing_for_backward_and_has_the_same_values():
    """``entropy_coeff=0`` (the entropy is only reported): no full-vocabulary intermediate of it is
    kept for a backward that never reaches it, whatever the chunking."""
    for options in (EntropyOptions(metric_only=True), EntropyOptions(4, True, metric_only=True)):
        assert _saved_elements(options) == 0
        logits = _logits(True)
        metric = response_entropy(logits, options)
        assert not metric.requires_grad
        torch.testing.assert_close(
            metric, response_entropy(logits, EntropyOptions()).detach(), rtol=0, atol=1e-6
        )
    assert _saved_elements(EntropyOptions()) > 0  # what the key saves


@pytest.mark.parametrize("coeff", [0.0, 0.01])
def test_the_actor_trains_on_the_entropy_only_when_its_coefficient_is_not_zero(coeff):
    from verl.config.ppo_trainer import load_config
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    config = load_config([f"actor_rollout_ref.actor.entropy_coeff={coeff}"]).actor_rollout_ref
    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)
    worker.config = config
    assert worker._entropy_options().metric_only == (coeff == 0)


def test_response_log_probs_gives_entropy_only_when_asked():
    module = torch.nn.Module()
    vocab = 6

    def forward(input_ids, **_):
        return type("Out", (), {"logits": torch.nn.functional.one_hot(input_ids, vocab).float() * 2.0})()

    module.forward = forward
    ids = torch.tensor([[1, 2, 3, 4]])
    micro = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": ids,
        "responses": ids[:, 2:],
    }
    assert "entropys" not in response_log_probs(module, micro, 1.0)
    plain = response_log_probs(module, micro, 1.0, EntropyOptions())["entropys"]
    chunked = response_log_probs(module, micro, 1.0, EntropyOptions(chunk_size=1, checkpointing=True))[
        "entropys"
    ]
    assert plain.shape == (1, 2)
    torch.testing.assert_close(chunked, plain)


def test_sum_pi_squared_is_the_temperature_scaled_distribution_s():
    """``calculate_sum_pi_squared``: sum_v softmax(logits / T)_v^2 at each response position."""
    vocab, temperature = 5, 0.7
    table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(1))
    module = torch.nn.Module()
    module.forward = lambda input_ids, **_: type("Out", (), {"logits": table[input_ids]})()
    ids = torch.tensor([[0, 3, 1, 4, 2]])
    micro = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": ids,
        "responses": ids[:, 2:],
    }
    assert "sum_pi_squared" not in response_log_probs(module, micro, temperature)
    got = response_log_probs(module, micro, temperature, sum_pi_squared=True)["sum_pi_squared"]
    # the logits at positions 1..3 predict the response tokens at 2..4
    expected = torch.softmax(table[ids[0, 1:4]] / temperature, dim=-1).pow(2).sum(-1).unsqueeze(0)
    torch.testing.assert_close(got, expected)
    assert bool(((got > 1 / vocab - 1e-6) & (got <= 1)).all())  # between uniform and one-hot


@pytest.mark.parametrize(
    "dtype, temperature", [(torch.float32, 1.0), (torch.float32, 0.6), (torch.bfloat16, 0.7)]
)
def test_log_probs_a_few_rows_at_a_time_equal_the_whole_batch_at_once_bit_for_bit(
    monkeypatch, dtype, temperature
):
    from verl.utils.torch_functional import logprobs_from_logits
    from verl.workers import forward

    g = torch.Generator().manual_seed(3)
    head = torch.randn(7, 5, 301, generator=g).to(dtype).requires_grad_()
    labels = torch.randint(0, 301, (7, 5), generator=g)
    monkeypatch.setattr(forward, "LOG_PROB_CHUNK_BYTES", 4 * 5 * 301 * 2)  # two rows a chunk: 4 chunks
    chunked = forward.response_token_log_probs(head, labels, temperature)
    whole = logprobs_from_logits(forward.scaled_logits(head, temperature), labels)
    assert torch.equal(chunked, whole)
    upstream = torch.randn(7, 5, generator=g)
    (chunked_grad,) = torch.autograd.grad(chunked, head, upstream)
    (whole_grad,) = torch.autograd.grad(whole, head, upstream)
    assert torch.equal(chunked_grad, whole_grad)
    with torch.no_grad():
        assert torch.equal(forward.response_token_log_probs(head, labels, temperature), whole)

    # autograd keeps the head's own outputs (views of them) and the labels: no fp32 logits or
    # log-softmax of the whole batch wait for backward, as they do unchunked
    def saved_storages(fn):
        storages = []

        def pack(t):
            storages.append(t.untyped_storage().data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        return set(storages)

    own = {head.untyped_storage().data_ptr(), labels.untyped_storage().data_ptr()}
    assert saved_storages(lambda: forward.response_token_log_probs(head, labels, temperature)) <= own
    assert (
        not saved_storages(lambda: logprobs_from_logits(forward.scaled_logits(head, temperature), labels))
        <= own
    )


@pytest.mark.parametrize(
    "grad, options", [(False, EntropyOptions()), (True, EntropyOptions(metric_only=True))]
)
def test_untrained_entropy_and_sum_pi_squared_a_few_rows_at_a_time_equal_the_whole_batch(
    monkeypatch, grad, options
):
    """The entropy nobody trains on (log-prob passes, or a metric) and ``sum_pi_squared`` are
    computed per chunk of rows, outside autograd: bit for bit the whole batch's values."""
    from verl.workers import forward

    g = torch.Generator().manual_seed(4)
    table = torch.randn(301, 301, generator=g)
    module = torch.nn.Module()
    module.forward = lambda input_ids, **_: type("Out", (), {"logits": table[input_ids] * 1.0})()
    ids = torch.randint(0, 301, (7, 9), generator=g)
    micro = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": ids,
        "responses": ids[:, 4:],
    }
    head = table[ids[:, 3:8]]  # the logits that predict the five response tokens
    monkeypatch.setattr(forward, "LOG_PROB_CHUNK_BYTES", 4 * 5 * 301 * 2)  # two rows a chunk: 4 chunks
    chunks = []
    real_scaled = forward.scaled_logits
    monkeypatch.setattr(forward, "scaled_logits", lambda h, t: chunks.append(len(h)) or real_scaled(h, t))
    with torch.set_grad_enabled(grad):
        got = forward.response_log_probs(module, micro, 0.7, options, sum_pi_squared=True)
    assert chunks == [2, 2, 2, 1] * 3  # the log-probs', the entropy's and sum_pi_squared's chunks
    logits = real_scaled(head, 0.7)
    assert torch.equal(got["entropys"], entropy_from_logits(logits))
    assert torch.equal(got["sum_pi_squared"], torch.softmax(logits, dim=-1).square().sum(-1))
    assert not got["entropys"].requires_grad and not got["sum_pi_squared"].requires_grad
