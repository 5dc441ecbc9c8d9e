"""An OpenAI-compatible chat endpoint on loopback that records every completion as training data.

Each episode of the ``openai_agent`` loop gets a base URL ``http://127.0.0.1:<port>/episodes/<id>/v1``;
an agent written for the ``openai`` client calls ``chat.completions.create(messages=..., tools=...)``
there as it would call any OpenAI-compatible server. The proxy renders the messages with the
tokenizer's chat template (and the tool schemas), generates on the rollout servers, returns the
answer in OpenAI's format (Hermes tool calls parsed into ``message.tool_calls``) and records the
exact token ids and log-probs.

Token-in/token-out across turns: when a request repeats the episode's previous messages plus the
assistant message it was given and new messages (tool results, a user turn), its prompt is built
as *previous prompt + generated ids + the chat template's rendering of the new messages*, so the
model's earlier output is never re-tokenized. The episode's training sample is that chain: the
first prompt, then every generated token (mask 1) and every rendered new message (mask 0). A
request that rewrites the history starts a new chain; only the last chain is trained on (the
completions of earlier chains are counted in ``agent/openai_dropped_completions``).
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from verl.experimental.agent_loop.agent_loop import Trajectory, render_continuation
from verl.experimental.agent_loop.tool_parser import parameter_types, parse_tool_calls
from verl.workers.rollout.http_front import JSONHandler, LoopbackHTTPServer, error_body
from verl.workers.rollout.server_client import RolloutServerError, post_json

ACCEPTED = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "n",
    "logprobs",
    "top_logprobs",
    "stream",
    "user",
    "parallel_tool_calls",
}


class ChatRequestError(ValueError):
    pass


@dataclass
class Episode:
    address: str
    budget: int
    seed: int | None
    prompt_ids: list[int] = field(default_factory=list)
    chain: Trajectory = field(default_factory=Trajectory)
    """The sample so far: the generated ids and the renderings of the messages added between them."""
    history: list[tuple] = field(default_factory=list)
    """The normalised messages of the chain so far, ending with the assistant message returned."""
    completions: int = 0
    chain_completions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class ChatProxy:
    def __init__(self, server_manager: Any, tokenizer: Any, config: Any, render: Any) -> None:
        self.server_manager, self.tokenizer, self.config = server_manager, tokenizer, config
        self.render = render  # (messages, add_generation_prompt, **extra) -> ids
        self.rollout = config.actor_rollout_ref.rollout
        self.episodes: dict[str, Episode] = {}
        self.httpd = LoopbackHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.address = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="chat-proxy", daemon=True)
        self._thread.start()

    def open_episode(self, seed: int | None) -> tuple[str, str]:
        """A new episode: its id and the base URL to give the ``openai`` client."""
        episode_id = uuid.uuid4().hex
        address = min(self.server_manager.addresses, key=lambda a: self.server_manager.in_flight[a])
        self.episodes[episode_id] = Episode(address, self.rollout.response_length, seed)
        return episode_id, f"{self.address}/episodes/{episode_id}/v1"

    def close_episode(self, episode_id: str) -> Episode:
        return self.episodes.pop(episode_id)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------ one request
    def chat(self, episode_id: str, body: dict[str, Any]) -> dict[str, Any]:
        episode = self.episodes.get(episode_id)
        if episode is None:
            raise KeyError(f"no open episode {episode_id!r}")
        unknown = sorted(set(body) - ACCEPTED)
        if unknown:
            raise ChatRequestError(f"unsupported field(s) {unknown}")
        if body.get("stream") or int(body.get("n", 1)) != 1:
            raise ChatRequestError("stream=true and n>1 are not supported")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ChatRequestError("messages must be a non-empty list")
        with episode.lock:  # one request of an episode at a time: the chain is sequential
            return self._complete(episode, messages, body)

    def _complete(self, episode: Episode, messages: list[dict], body: dict[str, Any]) -> dict[str, Any]:
        normalised = [_normalise(m) for m in messages]
        continues = bool(episode.history) and normalised[: len(episode.history)] == episode.history
        if continues:
            new = messages[len(episode.history) :]
            delta = render_continuation(self.render, new) if new else []
            prompt_ids = episode.prompt_ids + episode.chain.response_ids + delta
        else:  # the first request, or the agent rewrote its history: a new chain
            delta, prompt_ids = [], self.render(messages, True, tools=body.get("tools") or None)
            episode.prompt_ids, episode.chain, episode.chain_completions = prompt_ids, Trajectory(), 0
        room = episode.budget - len(episode.chain.response_ids) - len(delta)
        wanted = body.get("max_completion_tokens") or body.get("max_tokens") or room
        out = self._generate(episode, prompt_ids, min(int(wanted), room), body) if room > 0 else None
        tokens = out["token_ids"] if out else []
        episode.chain.add_context_tokens(delta)
        episode.chain.add_model_tokens(
            tokens, out["log_probs"] if out else [], out["token_versions"] if out else []
        )
        episode.completions += 1
        episode.chain_completions += 1
        message = self._message(tokens, body.get("tools") or [])
        episode.history = [*normalised, _normalise(message)]
        return self._response(prompt_ids, tokens, out, message, body)

    def _generate(
        self, episode: Episode, prompt_ids: list[int], max_tokens: int, body: dict
    ) -> dict[str, Any]:
        request = {"prompt_ids": prompt_ids, "max_tokens": max_tokens}
        for key in ("temperature", "top_p"):
            if body.get(key) is not None:
                request[key] = body[key]
        seed = body.get("seed", episode.seed)
        if seed is not None:
            request["seed"] = int(seed) + 7919 * episode.completions
        return post_json(f"{episode.address}/generate", request, self.rollout.server.timeout_s)

    def _message(self, tokens: list[int], tools: list[dict[str, Any]]) -> dict[str, Any]:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        parsed = parse_tool_calls(text, self.rollout.multi_turn.format, parameter_types(tools))
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
        if parsed.calls:
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in parsed.calls
            ]
        return message

    def _response(self, prompt_ids, tokens, out, message, body) -> dict[str, Any]:
        finish = "tool_calls" if message.get("tool_calls") else (out["finish_reason"] if out else "length")
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(tokens, out["log_probs"] if out else [])
                ]
            }
        choice.update(
            prompt_token_ids=prompt_ids, token_ids=tokens, token_versions=out["token_versions"] if out else []
        )
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "policy"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(tokens),
                "total_tokens": len(prompt_ids) + len(tokens),
            },
        }


def _normalise(message: Any) -> tuple:
    """What identifies a message in the chain: role, text and tool calls (name + arguments),
    whatever extra fields the client serialised (``None``s, ``refusal``, call ids)."""
    m = message if isinstance(message, dict) else dict(message)
    calls = tuple(
        (
            c.get("function", {}).get("name"),
            json.dumps(_loads(c.get("function", {}).get("arguments")), sort_keys=True),
        )
        for c in (m.get("tool_calls") or [])
    )
    return (m.get("role"), m.get("content") or "", calls)


def _loads(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def _handler_for(proxy: ChatProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(JSONHandler):
        def do_GET(self) -> None:
            if self.path.endswith("/v1/models"):
                self.reply(200, {"object": "list", "data": [{"id": "policy", "object": "model"}]})
            else:
                self.reply(404, error_body(f"no such endpoint: GET {self.path}"))

        def do_POST(self) -> None:
            parts = self.path.strip("/").split("/")
            if len(parts) != 5 or parts[0] != "episodes" or parts[2:] != ["v1", "chat", "completions"]:
                self.reply(404, error_body(f"no such endpoint: POST {self.path}"))
                return
            try:
                self.reply(200, proxy.chat(parts[1], self.read_json()))
            except KeyError as error:
                self.reply(404, error_body(str(error)))
            except (ChatRequestError, ValueError, TypeError) as error:
                self.reply(400, error_body(str(error)))
            except RolloutServerError as error:
                self.reply(502, error_body(str(error)))

    return Handler
