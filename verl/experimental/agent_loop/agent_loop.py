"""Agent loops: one dataset row -> one trajectory, by talking to the rollout servers.

An agent loop (a subclass of :class:`AgentLoopBase`, registered by name with :func:`register`)
gets the row's columns (``raw_prompt``, ``extra_info``, ...) and sampling parameters, calls
``self.server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` as often as
it needs (token ids in, token ids + log-probs + weight versions out), and returns an
:class:`AgentLoopOutput`: the prompt ids, the response ids (model tokens and the tokens of
tool/user turns, in order), a response mask (1 = model token) and the model tokens' log-probs.
Model output is never decoded and re-encoded to build the sample.

The dataset column ``agent_name`` picks the loop of each row (default
``rollout.agent.default_agent_loop``); loops of a custom YAML (``rollout.agent.agent_loop_config_path``:
a list of ``{name, _target_}``) are registered at start-up. The signatures follow verl's, so a
custom loop written for verl's ``AgentLoopBase`` needs only its imports changed.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import torch
import yaml

from verl.interactions.base import BaseInteraction
from verl.utils.dataset.vision import VisionProcessor, image_messages
from verl.workers.rollout.server_client import post_json
from verl.workers.vision import MULTI_MODAL_INPUTS, encode_images


@dataclass
class AgentLoopOutput:
    prompt_ids: list[int]
    """Prompt token ids (what the first generation saw)."""
    response_ids: list[int]
    """Everything after the prompt: model tokens and tool/user turn tokens, in order."""
    response_mask: list[int]
    """1 on model tokens, 0 on tool/user turn tokens."""
    response_logprobs: list[float] | None = None
    """Log-probs of the response tokens (0 on tool/user tokens)."""
    response_versions: list[int] | None = None
    """Weight version behind each response token (-1 on tool/user tokens)."""
    reward_score: float | None = None
    """A reward the loop computed itself (none: the reward manager scores the trajectory)."""
    num_turns: int = 0
    """Chat turns: user, assistant and tool messages."""
    metrics: dict[str, float] = field(default_factory=dict)
    extra_fields: dict[str, Any] = field(default_factory=dict)
    multi_modal_inputs: dict[str, torch.Tensor] | None = None
    """A vision-language policy's images of the whole sequence, in the order of their image blocks
    (the prompt's, then those tools returned): ``pixel_values`` and ``image_grid_thw``; ``{}`` without
    images, None from a loop that does not handle them (``AgentLoopBase.takes_images``)."""


@dataclass
class Trajectory:
    """A multi-turn response as it grows: model tokens (mask 1, with the engine's log-probs and
    weight versions) and context tokens the model did not write (tool or user turns: mask 0,
    log-prob 0, version -1)."""

    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def add_model_tokens(self, token_ids: list[int], log_probs: list[float], versions: list[int]) -> None:
        self.response_ids += token_ids
        self.mask += [1] * len(token_ids)
        self.log_probs += log_probs
        self.versions += versions

    def add_context_tokens(self, token_ids: list[int]) -> None:
        self.response_ids += token_ids
        self.mask += [0] * len(token_ids)
        self.log_probs += [0.0] * len(token_ids)
        self.versions += [-1] * len(token_ids)


def render_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
    **extra: Any,
) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template."""
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        **(template_kwargs or {}),
        **extra,
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def render_continuation(render: Callable[..., list[int]], new_messages: list[dict[str, Any]]) -> list[int]:
    """The tokens the chat template puts after an assistant turn for ``new_messages`` (tool results,
    a user turn) and the next generation prompt: the difference between a rendering with and
    without them. ``render(messages, add_generation_prompt)`` is the chat template."""
    base = [{"role": "user", "content": "."}]
    before = render(base, False)
    after = render(base + new_messages, True)
    if after[: len(before)] != before:
        raise ValueError("the chat template does not render these messages as a continuation of the chat")
    return after[len(before) :]


@dataclass
class TokenOutput:
    token_ids: list[int]
    log_probs: list[float]
    versions: list[int]
    finish_reason: str | None = None


class ServerManager:
    """Sends generation requests to the rollout servers: a new trajectory goes to the replica with
    the fewest requests in flight, and its later turns to the same replica (its prefix cache)."""

    def __init__(self, addresses: list[str], timeout_s: float, executor: Executor) -> None:
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self.executor = executor
        self.in_flight = dict.fromkeys(self.addresses, 0)
        self.sticky: dict[str, str] = {}

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        multi_modal_inputs: dict[str, torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """``sampling_params``: ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
        ``do_sample``, ``validate`` (other keys, e.g. verl's ``logprobs``, are dropped).
        ``multi_modal_inputs``: the images of a vision-language prompt, one per image block of
        ``prompt_ids`` (expanded to the model's image tokens), sent with every turn."""
        address = self.sticky.get(request_id) or min(self.addresses, key=lambda a: self.in_flight[a])
        self.sticky[request_id] = address
        body = {k: v for k, v in sampling_params.items() if k in _SAMPLING_KEYS}
        body["prompt_ids"] = list(prompt_ids)
        if multi_modal_inputs:
            body["multi_modal_inputs"] = encode_images(multi_modal_inputs)
        self.in_flight[address] += 1
        try:
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(
                self.executor, post_json, f"{address}/generate", body, self.timeout_s
            )
        finally:
            self.in_flight[address] -= 1
        return TokenOutput(out["token_ids"], out["log_probs"], out["token_versions"], out["finish_reason"])

    def release(self, request_id: str) -> None:
        self.sticky.pop(request_id, None)


_SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "do_sample", "validate")


class AgentLoopBase(ABC):
    """``config``: the whole trainer config; ``tools``: the tools of ``multi_turn.tool_config_path``
    by name; ``interactions``: the simulated users of ``multi_turn.interaction_config_path`` by name;
    ``processor``: the policy's :class:`VisionProcessor` (None for a text model)."""

    takes_images = False
    """Whether the loop passes a row's images to the model (and returns them in
    ``AgentLoopOutput.multi_modal_inputs``); rows with images are refused for a loop that does not."""

    def __init__(
        self,
        config: Any,
        server_manager: ServerManager,
        tokenizer: Any,
        tools: dict[str, Any] | None = None,
        processor: VisionProcessor | None = None,
        interactions: dict[str, BaseInteraction] | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = config
        self.processor = processor
        self.rollout_config = config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.tools = tools or {}
        self.interactions = interactions or {}
        self.apply_chat_template_kwargs = dict(config.data.apply_chat_template_kwargs or {})

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One trajectory for the row whose columns are ``kwargs``."""

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, **extra: Any) -> list[int]:
        """Token ids of ``messages`` under the tokenizer's chat template."""
        return render_messages(
            self.tokenizer, messages, add_generation_prompt, self.apply_chat_template_kwargs, **extra
        )

    def render_prompt(self, row: dict[str, Any], **extra: Any) -> tuple[list[int], dict[str, torch.Tensor]]:
        """The row's ``raw_prompt`` under the chat template (``extra``: e.g. ``tools``), and its images:
        for a vision-language policy each ``<image>`` becomes an image part, expanded to the image
        tokens of the row's ``multi_modal_inputs`` (the dataset's pixels, reused as they are)."""
        messages = list(row["raw_prompt"])
        vision = dict(row.get(MULTI_MODAL_INPUTS) or {})
        if self.processor is None or not vision:
            return self.render(messages, add_generation_prompt=True, **extra), {}
        grid = vision["image_grid_thw"]
        messages = image_messages(messages, len(grid), "the row's raw_prompt")
        ids = self.render(messages, add_generation_prompt=True, **extra)
        return self.processor.expand_ids(ids, grid), vision

    @staticmethod
    def new_request_id() -> str:
        return uuid.uuid4().hex


_REGISTRY: dict[str, tuple[type[AgentLoopBase], dict[str, Any]]] = {}


def register(agent_name: str, **init_kwargs: Any):
    """Class decorator: make an agent loop available under ``agent_name`` (constructed with
    ``init_kwargs`` on top of the standard arguments)."""

    def decorator(cls: type[AgentLoopBase]) -> type[AgentLoopBase]:
        _REGISTRY[agent_name] = (cls, dict(init_kwargs))
        return cls

    return decorator


def get_agent_loop_class(
    agent_name: str, where: str = "agent_name"
) -> tuple[type[AgentLoopBase], dict[str, Any]]:
    """The class registered as ``agent_name`` and its extra constructor arguments."""
    if agent_name not in _REGISTRY:
        raise ValueError(f"{where}: no agent loop named {agent_name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[agent_name]


def register_from_config(path: str) -> list[str]:
    """Register the loops of a YAML list of ``{name, _target_: package.module.Class, ...}``; the
    entry's other keys are passed to the loop's constructor (e.g. ``function`` of ``openai_agent``)."""
    key = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{key}: {path}: no such file")
    with open(path) as f:
        entries = yaml.safe_load(f) or []
    if not isinstance(entries, list):
        raise ValueError(f"{key}: {path}: expected a list of {{name, _target_}} entries")
    names = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"name", "_target_"} <= set(entry):
            raise ValueError(f"{key}: {path}: entry {i} needs `name` and `_target_` (package.module.Class)")
        cls = import_object(str(entry["_target_"]), f"{key}: {path}: entry {i}")
        if not (isinstance(cls, type) and issubclass(cls, AgentLoopBase)):
            raise ValueError(
                f"{key}: {path}: entry {i}: {entry['_target_']!r} is not an AgentLoopBase subclass"
            )
        extras = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        register(str(entry["name"]), **extras)(cls)
        names.append(str(entry["name"]))
    return names


def import_object(dotted: str, where: str) -> Any:
    """``package.module.attr`` (or ``package.module:attr``) -> the object."""
    module_name, _sep, attr = dotted.rpartition(":") if ":" in dotted else dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValueError(f"{where}: cannot import {dotted!r} ({error})") from error
