"""An OpenAI-compatible HTTP front for a :class:`RolloutServer`, on loopback.

Endpoints (JSON):

* ``POST /v1/completions``: ``prompt`` (text or a list of token ids), ``max_tokens``,
  ``temperature``, ``top_p``, ``top_k``, ``n``, ``seed``, ``logprobs``;
* ``POST /v1/chat/completions``: ``messages`` (rendered with the tokenizer's chat template),
  ``max_tokens`` / ``max_completion_tokens``, ``temperature``, ``top_p``, ``top_k``, ``n``,
  ``seed``, ``logprobs``;
* ``POST /generate``: token ids in, token ids out (the trainer's client): ``prompt_ids`` and
  the sampling fields above, plus ``validate`` (use ``val_kwargs``), ``ignore_eos`` and
  ``multi_modal_inputs`` (a vision-language prompt's images, for an engine that takes them);
* ``GET /health``, ``GET /v1/models``.

Every choice also carries ``prompt_token_ids``, ``token_ids`` and ``token_versions`` (the
weight version behind each token), so that a sample is built from the tokens the engine
produced, never from re-tokenized text. ``max_tokens`` defaults to the rollout's
``response_length``. A field this server does not implement is refused (HTTP 400, naming
it) rather than ignored.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from verl.config.rollout import RolloutConfig
from verl.workers.rollout.sampling import SamplingParams
from verl.workers.rollout.server import Completion, GenerationRequest, RolloutServer
from verl.workers.vision import decode_images

SAMPLING_FIELDS = {
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "seed",
    "logprobs",
}
ACCEPTED = {
    "/v1/completions": SAMPLING_FIELDS | {"model", "prompt", "stream", "user", "top_logprobs"},
    "/v1/chat/completions": SAMPLING_FIELDS | {"model", "messages", "stream", "user", "top_logprobs"},
    "/generate": SAMPLING_FIELDS
    | {"prompt_ids", "validate", "ignore_eos", "do_sample", "multi_modal_inputs"},
}


class BadRequest(ValueError):
    pass


class LoopbackHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the trainer opens one connection per sample at once


class JSONHandler(BaseHTTPRequestHandler):
    """Replies with JSON bodies; no log line per request."""

    protocol_version = "HTTP/1.1"

    def reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")

    def log_message(self, format: str, *args: Any) -> None:  # one line per request is noise
        pass


def error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


class HTTPFront:
    """Serves ``server`` at ``http://127.0.0.1:<port>`` (port 0: any free port) from a thread."""

    def __init__(
        self,
        server: RolloutServer,
        tokenizer,
        config: RolloutConfig,
        model_name: str,
        timeout_s: float,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.server, self.tokenizer, self.config = server, tokenizer, config
        self.model_name, self.timeout_s = model_name, timeout_s
        self.httpd = LoopbackHTTPServer((host, port), _handler_for(self))
        self.address = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rollout-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------ requests
    def handle(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(body) - ACCEPTED[path])
        if unknown:
            raise BadRequest(
                f"{path}: unsupported field(s) {unknown}; this server accepts {sorted(ACCEPTED[path])}"
            )
        if body.get("stream"):
            raise BadRequest(f"{path}: stream=true is not supported")
        if path == "/generate":
            prompt_ids = _token_ids(body.get("prompt_ids"), "prompt_ids")
            return _completion_json(self._generate(prompt_ids, body, self._images(body))[0])
        if path == "/v1/completions":
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            else:
                prompt_ids = _token_ids(prompt, "prompt")
            return self._text_completion(prompt_ids, body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("/v1/chat/completions: messages must be a non-empty list")
        prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "input_ids"):
            prompt_ids = prompt_ids["input_ids"]
        return self._chat_completion(list(prompt_ids), body)

    def _params(self, body: dict[str, Any]) -> SamplingParams:
        meta = {k: body[k] for k in ("temperature", "top_p", "top_k", "do_sample", "validate") if k in body}
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None:
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise BadRequest(f"max_tokens must be a positive integer, got {max_tokens!r}")
            meta["response_length"] = max_tokens
        params = SamplingParams.resolve(self.config, meta)
        if "ignore_eos" in body:
            params = dataclasses.replace(params, ignore_eos=bool(body["ignore_eos"]))
        if params.do_sample and params.temperature <= 0:
            raise BadRequest(f"temperature must be positive when sampling, got {params.temperature}")
        return params

    def _images(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The request's images (:func:`~verl.workers.vision.encode_images`), for an engine that takes them."""
        if body.get("multi_modal_inputs") is None:
            return None
        if not getattr(self.server.engine, "takes_images", False):
            raise BadRequest(
                f"multi_modal_inputs: this rollout engine ({type(self.server.engine).__name__}) takes no "
                "images; a vision-language policy generates with actor_rollout_ref.rollout.name=hf"
            )
        try:
            return decode_images(body["multi_modal_inputs"])
        except ValueError as error:
            raise BadRequest(str(error)) from error

    def _generate(
        self, prompt_ids: list[int], body: dict[str, Any], images: dict[str, Any] | None = None
    ) -> list[Completion]:
        params, n, seed = self._params(body), int(body.get("n", 1)), body.get("seed")
        if n < 1:
            raise BadRequest(f"n must be at least 1, got {n}")
        # the engine always returns log-probs (a completion may become a training sample); the
        # OpenAI endpoints show them only when asked
        requests = [
            GenerationRequest(
                prompt_ids, params, None if seed is None else int(seed) + i, multi_modal_inputs=images
            )
            for i in range(n)
        ]
        futures = [self.server.submit(r) for r in requests]
        try:
            return [f.result(timeout=self.timeout_s) for f in futures]
        except FutureTimeout:
            for r in requests:
                self.server.abort(r.request_id)
            raise TimeoutError(
                f"generation did not finish within {self.timeout_s} s (actor_rollout_ref.rollout.server.timeout_s)"
            ) from None

    def _text_completion(self, prompt_ids: list[int], body: dict[str, Any]) -> dict[str, Any]:
        completions = self._generate(prompt_ids, body)
        choices = []
        for i, c in enumerate(completions):
            choice = {
                "index": i,
                "text": self.tokenizer.decode(c.token_ids),
                "finish_reason": c.finish_reason,
            }
            if body.get("logprobs") is not None:
                tokens = [self.tokenizer.decode([t]) for t in c.token_ids]
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": c.log_probs}
            choices.append({**choice, **_token_fields(c)})
        return self._envelope("text_completion", "cmpl", prompt_ids, completions, choices)

    def _chat_completion(self, prompt_ids: list[int], body: dict[str, Any]) -> dict[str, Any]:
        completions = self._generate(prompt_ids, body)
        choices = []
        for i, c in enumerate(completions):
            content_ids = [t for t in c.token_ids if t not in self.tokenizer.all_special_ids]
            message = {"role": "assistant", "content": self.tokenizer.decode(content_ids)}
            choice = {"index": i, "message": message, "finish_reason": c.finish_reason}
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "content": [
                        {
                            "token": self.tokenizer.decode([t]),
                            "logprob": lp,
                            "bytes": None,
                            "top_logprobs": [],
                        }
                        for t, lp in zip(c.token_ids, c.log_probs)
                    ]
                }
            choices.append({**choice, **_token_fields(c)})
        return self._envelope("chat.completion", "chatcmpl", prompt_ids, completions, choices)

    def _envelope(
        self, kind: str, prefix: str, prompt_ids: list[int], completions: list[Completion], choices
    ):
        generated = sum(len(c.token_ids) for c in completions)
        return {
            "id": f"{prefix}-{completions[0].request_id}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": generated,
                "total_tokens": len(prompt_ids) + generated,
            },
        }


def _token_ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and t >= 0 for t in value):
        raise BadRequest(f"{name} must be a non-empty list of token ids (non-negative integers)")
    return value


def _token_fields(c: Completion) -> dict[str, Any]:
    return {"prompt_token_ids": c.prompt_ids, "token_ids": c.token_ids, "token_versions": c.versions}


def _completion_json(c: Completion) -> dict[str, Any]:
    return {
        **_token_fields(c),
        "log_probs": c.log_probs,
        "finish_reason": c.finish_reason,
        "id": c.request_id,
    }


def _handler_for(front: HTTPFront) -> type[BaseHTTPRequestHandler]:
    class Handler(JSONHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                self.reply(200, {"status": "ok", **front.server.stats()})
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": front.model_name, "object": "model"}]})
            else:
                self.reply(404, error_body(f"no such endpoint: GET {self.path}"))

        def do_POST(self) -> None:
            if self.path not in ACCEPTED:
                self.reply(404, error_body(f"no such endpoint: POST {self.path}"))
                return
            try:
                body = self.read_json()
                if not isinstance(body, dict):
                    raise BadRequest("the request body must be a JSON object")
                self.reply(200, front.handle(self.path, body))
            except (BadRequest, json.JSONDecodeError, ValueError, TypeError) as error:
                self.reply(400, error_body(str(error)))
            except TimeoutError as error:
                self.reply(504, error_body(str(error)))
            except Exception as error:  # the engine failed: the client hears why
                self.reply(500, error_body(f"{type(error).__name__}: {error}"))

    return Handler
