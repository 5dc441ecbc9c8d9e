"""The OpenAI-compatible HTTP front: a real server on loopback, real HTTP clients
(``urllib`` and, where installed, the ``openai`` package)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.workers.rollout.test_hf_rollout import make_rollout
from verl.workers.rollout import build_server
from verl.workers.rollout.server_client import RolloutServerError, post_json

TIMEOUT = 120


@pytest.fixture(scope="module")
def front(builtin_assets):
    rollout, tokenizer = make_rollout(builtin_assets, response_length=8)
    server, http = build_server(rollout, rollout.config, tokenizer, "tiny")
    yield http, tokenizer
    http.close()
    server.close()


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        return json.loads(response.read())


def test_the_front_listens_on_loopback_and_reports_health(front):
    http, _ = front
    assert http.address.startswith("http://127.0.0.1:")
    assert get(f"{http.address}/health")["status"] == "ok"
    assert get(f"{http.address}/v1/models")["data"][0]["id"] == "tiny"


def test_generate_returns_token_ids_log_probs_and_versions(front):
    http, tokenizer = front
    ids = tokenizer("2+2=", add_special_tokens=False)["input_ids"]
    out = post_json(f"{http.address}/generate", {"prompt_ids": ids, "max_tokens": 5, "seed": 3}, TIMEOUT)
    n = len(out["token_ids"])
    assert 1 <= n <= 5 and out["prompt_token_ids"] == ids
    assert len(out["log_probs"]) == n and all(lp <= 0 for lp in out["log_probs"])
    assert out["token_versions"] == [0] * n and out["finish_reason"] in ("stop", "length")
    again = post_json(f"{http.address}/generate", {"prompt_ids": ids, "max_tokens": 5, "seed": 3}, TIMEOUT)
    assert again["token_ids"] == out["token_ids"]  # seeded: the same tokens


def test_completions_take_text_or_token_ids_and_return_both(front):
    http, tokenizer = front
    text = post_json(
        f"{http.address}/v1/completions",
        {"prompt": "5+3=", "max_tokens": 4, "seed": 1, "logprobs": 0},
        TIMEOUT,
    )
    choice = text["choices"][0]
    assert text["object"] == "text_completion"
    assert choice["prompt_token_ids"] == tokenizer("5+3=", add_special_tokens=False)["input_ids"]
    assert choice["text"] == tokenizer.decode(choice["token_ids"])
    assert choice["logprobs"]["token_logprobs"] and len(choice["logprobs"]["tokens"]) == len(
        choice["token_ids"]
    )
    assert text["usage"]["completion_tokens"] == len(choice["token_ids"])
    ids = post_json(
        f"{http.address}/v1/completions",
        {"prompt": choice["prompt_token_ids"], "max_tokens": 4, "seed": 1, "n": 3},
        TIMEOUT,
    )
    assert [c["index"] for c in ids["choices"]] == [0, 1, 2]
    assert ids["choices"][0]["token_ids"] == choice["token_ids"]  # same prompt, same seed


def test_chat_completions_render_the_chat_template(front):
    http, tokenizer = front
    messages = [{"role": "user", "content": "1+1="}]
    out = post_json(
        f"{http.address}/v1/chat/completions",
        {"messages": messages, "max_tokens": 6, "logprobs": True, "seed": 0},
        TIMEOUT,
    )
    choice = out["choices"][0]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    rendered = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
    assert choice["prompt_token_ids"] == list(rendered)
    assert choice["message"]["role"] == "assistant"
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])


def test_bad_requests_get_a_clear_error(front):
    http, _ = front
    with pytest.raises(RolloutServerError, match=r"400.*unsupported field\(s\) \['stop'\]"):
        post_json(f"{http.address}/v1/completions", {"prompt": "1+1=", "stop": ["\n"]}, TIMEOUT)
    with pytest.raises(RolloutServerError, match=r"400.*prompt_ids must be a non-empty list"):
        post_json(f"{http.address}/generate", {"prompt_ids": "1+1="}, TIMEOUT)
    with pytest.raises(RolloutServerError, match=r"400.*max_tokens must be a positive integer"):
        post_json(f"{http.address}/generate", {"prompt_ids": [1], "max_tokens": 0}, TIMEOUT)
    with pytest.raises(urllib.error.HTTPError) as error:
        get(f"{http.address}/nowhere")
    assert error.value.code == 404


def test_the_openai_client_talks_to_it(front):
    openai = pytest.importorskip("openai", reason="the openai package is not installed (vllm brings it)")
    http, _ = front
    client = openai.OpenAI(base_url=f"{http.address}/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    completion = client.completions.create(model="tiny", prompt="4+4=", max_tokens=4, seed=2)
    assert completion.choices[0].finish_reason in ("stop", "length")
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "4+4="}], max_tokens=4, logprobs=True, seed=2
    )
    assert chat.choices[0].message.role == "assistant"
    assert len(chat.choices[0].logprobs.content) >= 1
    assert chat.choices[0].model_extra["token_ids"]  # the tokens ride along, for training
