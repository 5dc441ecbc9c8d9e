"""``tool_agent``: generate, run the tool calls the model made, append their answers, generate again.

One trajectory::

    prompt  = chat template(messages, tools=<schemas of multi_turn.tool_config_path>)
    repeat: model turn      (generated ids, mask 1, engine log-probs)
            tool calls      parsed from the turn's text (multi_turn.format: hermes)
            tool turn       chat template of the tool messages (mask 0, log-prob 0)
         or user turn       an interaction's reply to a turn without a call (mask 0, log-prob 0)
    until   the model answers without a call (and no interaction, or the interaction ends the chat),
            the response budget (rollout.response_length) is spent, or multi_turn.max_assistant_turns /
            max_user_turns (tool and user turns together) is reached.

A malformed call, an unknown tool, a tool that raises and a tool that overruns its time-out
(the tool's ``call_timeout_s`` attribute, else ``timeout_s`` of its YAML config, default 30 s) each become an ``Error: ...`` message to
the model and a count in the metrics (``agent/tool_errors/<kind>``); the trajectory goes on.
Each tool gets ``create`` at the start (with ``extra_info.tools_kwargs[<name>].create_kwargs``),
``calc_reward`` and ``release`` at the end, whatever happened in between. Tools run on the agent
loop's event loop: a tool that blocks (a subprocess, a network call) should ``await`` it.

Interactions (``multi_turn.interaction_config_path``, :mod:`verl.interactions`): the row's
``extra_info.interaction_kwargs.name`` picks one; it gets ``start_interaction`` at the start (with the
row's interaction kwargs), ``generate_response`` with the chat so far after each answer, and
``finalize_interaction`` at the end. Its turn scores are the output's ``turn_scores``. A reply that ends
the chat is not appended: the trajectory ends on the model's turn, which carries the reward.

Images (a vision-language policy): the prompt's images come with the row (``multi_modal_inputs``);
a tool may answer with images too (``ToolResponse.image``). Its message is then the images' parts
followed by its text, each image expanded to the model's image tokens, and its pixels join the
trajectory's images, which every later turn and the trainer's forward get (the M-RoPE positions
of the whole sequence are built from them, :mod:`verl.experimental.agent_loop.manager`). A tool
image for a text-only policy, or a video, is an error naming the tool; an image that cannot be
read or that the image processor refuses is an ``Error: ...`` answer (``tool_errors/exception``).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopOutput,
    TokenOutput,
    Trajectory,
    register,
    render_continuation,
)
from verl.experimental.agent_loop.tool_parser import ParsedTurn, parameter_types, parse_tool_calls
from verl.interactions.base import BaseInteraction
from verl.interactions.utils.interaction_registry import INTERACTION_CONFIG_KEY
from verl.tools.schemas import OpenAIFunctionCall, ToolResponse
from verl.utils.dataset.schema import DatasetError
from verl.utils.dataset.vision import load_image
from verl.workers.vision import micro_batch_vision

DEFAULT_TOOL_TIMEOUT_S = 30.0
ERROR_KINDS = ("malformed", "unknown", "exception", "timeout")
SEED_STRIDE_PER_TURN = 7919


@dataclass
class _Trajectory(Trajectory):
    """The response, and the counts the metrics report."""

    assistant_turns: int = 0
    tool_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    tool_rewards: list[float] = field(default_factory=list)
    turn_scores: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The chat as messages (the model's turns decoded), for an interaction to read."""
    images: list[dict[str, Any]] = field(default_factory=list)
    """The image inputs of the prompt and of each tool turn that had images, in order."""

    def vision(self) -> dict[str, Any]:
        """The images of the sequence so far, concatenated in order (``{}`` without images)."""
        return micro_batch_vision(self.images)

    def add_model_turn(self, out: TokenOutput) -> None:
        self.add_model_tokens(out.token_ids, out.log_probs, out.versions)
        self.assistant_turns += 1

    def add_context_turn(self, turn: _ContextTurn) -> None:
        self.add_context_tokens(turn.ids)
        if turn.role == "user":
            self.user_turns += 1
        else:
            self.tool_turns += 1
        if turn.vision:
            self.images.append(turn.vision)


@dataclass
class _ContextTurn:
    """A turn the model did not write: the tools' answers or a simulated user's reply."""

    role: str
    ids: list[int]
    vision: dict[str, Any] = field(default_factory=dict)


@dataclass
class _SimulatedUser:
    """The row's interaction and its instance."""

    interaction: BaseInteraction
    instance_id: str
    kwargs: dict[str, Any]

    async def reply(self, messages: list[dict[str, Any]]) -> tuple[bool, str, float | None]:
        """(should_terminate, the user's reply, the turn's score)."""
        done, text, score, _ = await self.interaction.generate_response(
            self.instance_id, messages, **self.kwargs
        )
        if not isinstance(text, str):
            name = type(self.interaction).__name__
            raise TypeError(f"{name}.generate_response returned {text!r} as the reply; expected a str")
        return bool(done), text, None if score is None else float(score)


@dataclass
class _Answer:
    """One call's answer: the text for the model and, from a tool that returned images, their inputs."""

    text: str
    vision: dict[str, Any] = field(default_factory=dict)

    def message(self, text: str) -> dict[str, Any]:
        """The tool message: the images' parts, then the text (``text``: the answer's, truncated)."""
        if not self.vision:
            return {"role": "tool", "content": text}
        parts: list[dict[str, str]] = [{"type": "image"}] * len(self.vision["image_grid_thw"])
        return {"role": "tool", "content": parts + ([{"type": "text", "text": text}] if text else [])}


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    takes_images = True

    @functools.cached_property
    def parameter_types(self) -> dict[str, dict[str, str]]:
        """What the tools' schemas declare, for the XML call formats' text values."""
        return parameter_types([tool.tool_schema.to_dict() for tool in self.tools.values()])

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        schemas = [tool.tool_schema.to_dict() for tool in self.tools.values()]
        prompt_ids, vision = self.render_prompt(kwargs, tools=schemas or None)
        trajectory = _Trajectory(images=[vision] if vision else [], messages=list(kwargs["raw_prompt"]))
        instances = await self._create_instances(_tools_kwargs(kwargs))
        request_id = self.new_request_id()
        user = None
        try:
            user = await self._start_user(request_id, kwargs)
            await self._converse(request_id, prompt_ids, sampling_params, trajectory, instances, user)
            for name, instance_id in instances.items():
                trajectory.tool_rewards.append(await self.tools[name].calc_reward(instance_id))
        finally:
            self.server_manager.release(request_id)
            for name, instance_id in instances.items():
                await self.tools[name].release(instance_id)
            if user is not None:
                await user.interaction.finalize_interaction(user.instance_id)
        return self._output(prompt_ids, trajectory, user is not None)

    async def _converse(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        t: _Trajectory,
        instances: dict[str, str],
        user: _SimulatedUser | None,
    ) -> None:
        cfg, budget = self.rollout_config.multi_turn, self.rollout_config.response_length
        while len(t.response_ids) < budget:
            params = {**sampling_params, "max_tokens": budget - len(t.response_ids)}
            if sampling_params.get("seed") is not None:  # each turn its own (reproducible) draws
                params["seed"] = int(sampling_params["seed"]) + SEED_STRIDE_PER_TURN * t.assistant_turns
            out = await self.server_manager.generate(
                request_id,
                prompt_ids=prompt_ids + t.response_ids,
                sampling_params=params,
                multi_modal_inputs=t.vision(),
            )
            t.add_model_turn(out)
            if out.finish_reason == "length" or _reached(t.assistant_turns, cfg.max_assistant_turns):
                return
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            t.messages.append({"role": "assistant", "content": text})
            parsed = parse_tool_calls(text, cfg.format, self.parameter_types)
            if not parsed.calls and not parsed.errors and user is None:
                return  # an answer: the trajectory is done
            if _reached(t.tool_turns + t.user_turns, cfg.max_user_turns):
                return
            if parsed.calls or parsed.errors:
                turn = await self._tool_turn(parsed, instances, t)
            else:
                turn = await self._user_turn(user, t)
            if turn is None or len(t.response_ids) + len(turn.ids) >= budget:
                return  # done, or no room to answer: end on the model's turn (it carries the reward)
            t.add_context_turn(turn)

    async def _user_turn(self, user: _SimulatedUser, t: _Trajectory) -> _ContextTurn | None:
        """The simulated user's reply to the model's answer (None: the user ends the chat)."""
        done, reply, score = await user.reply(t.messages)
        if score is not None:
            t.turn_scores.append(score)
        message = {"role": "user", "content": reply}
        t.messages.append(message)
        return None if done else _ContextTurn("user", render_continuation(self.render, [message]))

    async def _tool_turn(self, parsed: ParsedTurn, instances: dict[str, str], t: _Trajectory) -> _ContextTurn:
        """The answers to the model's tool calls (and to the calls it got wrong), as one turn."""
        t.errors["malformed"] += len(parsed.errors)
        answers = [_Answer(f"Error: {error}") for error in parsed.errors]
        calls = parsed.calls[: self.rollout_config.multi_turn.max_parallel_calls]
        answers += await asyncio.gather(*(self._call(call, instances, t) for call in calls))
        messages = [a.message(self._truncate(a.text)) for a in answers]
        t.messages += messages
        ids = render_continuation(self.render, messages)
        vision = micro_batch_vision([a.vision for a in answers])
        if vision:
            ids = self.processor.expand_ids(ids, vision["image_grid_thw"])
        return _ContextTurn("tool", ids, vision)

    async def _start_user(self, request_id: str, row: dict[str, Any]) -> _SimulatedUser | None:
        """The row's interaction (``extra_info.interaction_kwargs.name``), started; None without any."""
        if not self.interactions:
            return None
        kwargs = _interaction_kwargs(row)
        name = kwargs.get("name")
        if name not in self.interactions:
            raise ValueError(
                f"the row's extra_info.interaction_kwargs.name is {name!r}; with "
                f"{INTERACTION_CONFIG_KEY} set, every tool_agent row names one of its interactions: "
                f"{sorted(self.interactions)}"
            )
        interaction = self.interactions[name]
        instance_id = await interaction.start_interaction(request_id, **kwargs)
        return _SimulatedUser(interaction, instance_id or request_id, kwargs)

    async def _call(self, call: OpenAIFunctionCall, instances: dict[str, str], t: _Trajectory) -> _Answer:
        t.tool_calls += 1
        tool = self.tools.get(call.name)
        if tool is None:
            t.errors["unknown"] += 1
            return _Answer(f"Error: there is no tool named {call.name!r}; available: {sorted(self.tools)}")
        timeout = getattr(tool, "call_timeout_s", None) or float(
            tool.config.get("timeout_s", DEFAULT_TOOL_TIMEOUT_S)
        )
        try:
            response, reward, _ = await asyncio.wait_for(
                tool.execute(instances[call.name], call.arguments), timeout
            )
        except TimeoutError:
            t.errors["timeout"] += 1
            return _Answer(f"Error: the tool {call.name!r} did not answer within {timeout:g} s")
        except Exception as error:  # a failing tool is the model's problem to handle, not the step's
            t.errors["exception"] += 1
            return _Answer(f"Error: the tool {call.name!r} failed: {type(error).__name__}: {error}")
        t.tool_rewards.append(float(reward))
        return self._answer(call.name, response, t)

    def _answer(self, name: str, response: ToolResponse, t: _Trajectory) -> _Answer:
        """The answer of a tool that ran: its text, and the inputs of the images it returned."""
        text = response.text or ""
        images = [image for image in response.image or [] if image is not None]
        if response.video:
            raise ValueError(
                f"the tool {name!r} returned a video (ToolResponse.video); videos are not supported, "
                "only images (ToolResponse.image)"
            )
        if not images:
            return _Answer(text)
        if self.processor is None:  # a setup error, not something the model could learn from
            raise ValueError(
                f"the tool {name!r} returned {len(images)} image(s), but the policy "
                f"(actor_rollout_ref.model.path={self.config.actor_rollout_ref.model.path}) is a text-only "
                "model that cannot see them; use a vision-language model or make the tool answer in text"
            )
        where = f"the tool {name!r}'s image"
        try:
            loaded = [load_image(image, f"{where} {i}") for i, image in enumerate(images)]
            return _Answer(text, self.processor.images(loaded, where))
        except DatasetError as error:
            t.errors["exception"] += 1
            return _Answer(f"Error: the tool {name!r} returned an image that cannot be used: {error}")

    async def _create_instances(self, tools_kwargs: dict[str, Any]) -> dict[str, str]:
        instances = {}
        for name, tool in self.tools.items():
            create_kwargs = (tools_kwargs.get(name) or {}).get("create_kwargs", {})
            instances[name], _ = await tool.create(**create_kwargs)
        return instances

    def _truncate(self, text: str) -> str:
        cfg = self.rollout_config.multi_turn
        limit = cfg.max_tool_response_length
        if len(text) <= limit:
            return text
        if cfg.tool_response_truncate_side == "left":
            return "..." + text[-limit:]
        if cfg.tool_response_truncate_side == "right":
            return text[:limit] + "..."
        return text[: limit // 2] + "..." + text[len(text) - (limit - limit // 2) :]

    def _output(self, prompt_ids: list[int], t: _Trajectory, interacted: bool) -> AgentLoopOutput:
        budget = self.rollout_config.response_length
        metrics = {"tool_calls": float(t.tool_calls)}
        metrics.update({f"tool_errors/{kind}": float(n) for kind, n in t.errors.items()})
        if interacted:
            metrics["user_turns"] = float(t.user_turns)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=t.response_ids[:budget],
            response_mask=t.mask[:budget],
            response_logprobs=t.log_probs[:budget],
            response_versions=t.versions[:budget],
            num_turns=1 + t.assistant_turns + t.tool_turns + t.user_turns,
            metrics=metrics,
            extra_fields={"tool_rewards": list(t.tool_rewards), "turn_scores": list(t.turn_scores)},
            multi_modal_inputs=t.vision(),
        )


def _reached(count: int, limit: int | None) -> bool:
    return limit is not None and count >= limit


def _tools_kwargs(row: dict[str, Any]) -> dict[str, Any]:
    return _row_kwargs(row, "tools_kwargs")


def _interaction_kwargs(row: dict[str, Any]) -> dict[str, Any]:
    return dict(_row_kwargs(row, "interaction_kwargs"))


def _row_kwargs(row: dict[str, Any], key: str) -> dict[str, Any]:
    """``extra_info[key]``, else the row's own column ``key``, else ``{}``."""
    extra = row.get("extra_info") or {}
    return (extra.get(key) if isinstance(extra, dict) else None) or row.get(key) or {}
