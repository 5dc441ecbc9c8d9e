"""``AgentLoopManager``: a batch of prompts -> one agent loop per row -> one training batch.

It has the ``generate_sequences(prompts, blocking=...)`` of a rollout worker group, so the
trainers and the validator use it unchanged (``rollout.multi_turn.enable=True`` selects it). The
loops of a batch run concurrently on one asyncio event loop (a thread of the driver): a slow tool
or a long answer never holds up the other trajectories. The batch the trainer gets:

* ``prompts`` [B, P] left-padded (the loop's own prompt, e.g. rendered with the tool schemas;
  cut from the left to ``rollout.prompt_length`` if longer, counted in ``agent/prompt_truncated``);
* ``responses`` [B, R] right-padded: model tokens and tool-turn tokens, in order;
* ``response_mask`` [B, R]: 1 on model tokens only (interior zeros on tool turns);
  ``attention_mask`` covers every real token, ``position_ids`` count them;
* ``rollout_log_probs`` (``calculate_log_probs``), ``response_versions`` (-1 off model tokens),
  ``policy_version``; non-tensor ``__num_turns__``, ``tool_rewards`` and ``turn_scores`` (the scores
  an interaction gave the trajectory's turns, :mod:`verl.interactions`);
* for a vision-language policy: ``multi_modal_inputs`` per row (the prompt's images, then those its
  tools returned, in the order of their image blocks; it replaces the prompts' column) and
  ``position_ids`` ``[B, 3, P + R]``, the M-RoPE positions of the whole sequence with all its images.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    ServerManager,
    get_agent_loop_class,
    register_from_config,
    render_messages,
)
from verl.experimental.agent_loop.chat_proxy import ChatProxy
from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
from verl.protocol import DataProto
from verl.utils.dataset.vision import load_vision_processor
from verl.workers.rollout.sampling import derived_seed
from verl.workers.rollout.server_client import MAX_CONCURRENCY, SAMPLING_META, PendingBatch
from verl.workers.vision import MULTI_MODAL_INPUTS


class AgentLoopManager:
    def __init__(self, config: Any, addresses: list[str], tokenizer: Any) -> None:
        from verl.experimental.agent_loop import (  # noqa: F401 (they register themselves)
            openai_agent_loop,
            single_turn_agent_loop,
            tool_agent_loop,
        )
        from verl.tools.tool_registry import initialize_tools_from_config

        self.config = config
        self.rollout = config.actor_rollout_ref.rollout
        self.tokenizer = tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.processor = load_vision_processor(config.actor_rollout_ref.model.path, tokenizer)
        if self.rollout.agent.agent_loop_config_path:
            register_from_config(self.rollout.agent.agent_loop_config_path)
        get_agent_loop_class(
            self.rollout.agent.default_agent_loop, "actor_rollout_ref.rollout.agent.default_agent_loop"
        )
        path = self.rollout.multi_turn.tool_config_path
        self.tools = {tool.name: tool for tool in initialize_tools_from_config(path)} if path else {}
        path = self.rollout.multi_turn.interaction_config_path
        self.interactions = initialize_interactions_from_config(path) if path else {}
        self._executor = ThreadPoolExecutor(max_workers=MAX_CONCURRENCY, thread_name_prefix="agent-http")
        self.server_manager = ServerManager(addresses, self.rollout.server.timeout_s, self._executor)
        render = functools.partial(
            render_messages, tokenizer, template_kwargs=dict(config.data.apply_chat_template_kwargs or {})
        )
        self.chat_proxy = ChatProxy(self.server_manager, tokenizer, config, render)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-loops", daemon=True)
        self._thread.start()

    def generate_sequences(self, prompts: DataProto, blocking: bool = True):
        future = asyncio.run_coroutine_threadsafe(self._generate(prompts), self._loop)
        return future.result() if blocking else PendingBatch(future)

    def close(self) -> None:
        self.chat_proxy.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ one batch
    async def _generate(self, prompts: DataProto) -> DataProto:
        meta = prompts.meta_info
        sampling = {k: meta[k] for k in SAMPLING_META if k in meta}
        seed = meta.get("sampling_seed")
        rows = [
            {k: v[i] for k, v in prompts.non_tensor_batch.items()}
            | {"raw_prompt_ids": _prompt_ids(prompts, i)}
            for i in range(len(prompts))
        ]
        runs = []
        for i, row in enumerate(rows):
            params = dict(sampling) if seed is None else {**sampling, "seed": derived_seed(seed, i)}
            runs.append(self._run(row, params))
        outputs = await asyncio.gather(*runs)
        return self._assemble(outputs, bool(meta.get("validate")))

    async def _run(self, row: dict[str, Any], sampling: dict[str, Any]) -> AgentLoopOutput:
        name = row.get("agent_name") or self.rollout.agent.default_agent_loop
        cls, init_kwargs = get_agent_loop_class(str(name), "the dataset column agent_name")
        if row.get(MULTI_MODAL_INPUTS) and not cls.takes_images:
            raise ValueError(
                f"the agent loop {name!r} ({cls.__name__}) does not pass a row's images to the model; rows "
                "with images run under tool_agent or single_turn_agent (the dataset column agent_name)"
            )
        loop = cls(
            self.config,
            self.server_manager,
            self.tokenizer,
            tools=self.tools,
            interactions=self.interactions,
            chat_proxy=self.chat_proxy,
            processor=self.processor,
            **init_kwargs,
        )
        return await loop.run(sampling, **row)

    def _assemble(self, outputs: list[AgentLoopOutput], validate: bool) -> DataProto:
        width, length = self.rollout.prompt_length, self.rollout.response_length
        batch = len(outputs)
        prompts = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros(batch, width, dtype=torch.long)
        responses = torch.full((batch, length), self.pad_token_id, dtype=torch.long)
        response_attention = torch.zeros(batch, length, dtype=torch.long)
        response_mask = torch.zeros(batch, length, dtype=torch.long)
        log_probs = torch.zeros(batch, length)
        versions = torch.full((batch, length), -1, dtype=torch.long)
        truncated = 0
        for i, out in enumerate(outputs):
            p = out.prompt_ids[-width:]
            truncated += len(out.prompt_ids) > width
            prompts[i, width - len(p) :] = torch.tensor(p)
            prompt_mask[i, width - len(p) :] = 1
            n = min(len(out.response_ids), length)
            responses[i, :n] = torch.tensor(out.response_ids[:n], dtype=torch.long)
            response_attention[i, :n] = 1
            response_mask[i, :n] = torch.tensor(out.response_mask[:n])
            if out.response_logprobs is not None:
                log_probs[i, :n] = torch.tensor(out.response_logprobs[:n])
            if out.response_versions is not None:
                versions[i, :n] = torch.tensor(out.response_versions[:n])
        versions = torch.where(response_mask.bool(), versions, -1)
        attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
        tensors = {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "response_versions": versions,
            "policy_version": _first_version(versions),
        }
        if self.rollout.calculate_log_probs and not validate:
            tensors["rollout_log_probs"] = log_probs * response_mask
        scored = [o.reward_score is not None for o in outputs]
        if any(scored) and not all(scored):
            raise ValueError(
                "a batch mixes agent loops that return their own reward (e.g. openai_agent) with loops scored "
                "by the reward manager; give all rows of a dataset one kind (agent_name column)"
            )
        if all(scored):  # the loops scored their trajectories: the reward manager passes these on
            last = (response_attention.sum(-1) - 1).clamp(min=0)
            scores = torch.zeros(batch, length)
            scores[torch.arange(batch), last] = torch.tensor([float(o.reward_score) for o in outputs])
            tensors["rm_scores"] = scores
        non_tensor = {
            "__num_turns__": np.array([o.num_turns for o in outputs], dtype=np.int64),
            "tool_rewards": _object_array([o.extra_fields.get("tool_rewards", []) for o in outputs]),
            "turn_scores": _object_array([o.extra_fields.get("turn_scores", []) for o in outputs]),
        }
        if self.processor is not None:
            self._add_images(tensors, non_tensor, outputs)
        metrics = _metrics(outputs)
        metrics["agent/prompt_truncated"] = float(truncated)
        return DataProto.from_dict(tensors, non_tensors=non_tensor, meta_info={"metrics": metrics})

    def _add_images(
        self,
        tensors: dict[str, torch.Tensor],
        non_tensor: dict[str, np.ndarray],
        outputs: list[AgentLoopOutput],
    ) -> None:
        """A vision-language policy's rows: each one's images as ``multi_modal_inputs`` and the M-RoPE
        positions ``[B, 3, L]`` of its whole sequence (prompt, model and tool turns) with them."""
        ids, mask = tensors["input_ids"], tensors["attention_mask"]
        token, merge = self.processor.image_token_id, self.processor.merge_size
        positions, column = [], []
        for i, out in enumerate(outputs):
            vision = out.multi_modal_inputs or {}
            if vision and len(out.prompt_ids) > self.rollout.prompt_length:
                raise ValueError(
                    f"row {i}: a prompt with images has {len(out.prompt_ids)} tokens, more than "
                    f"actor_rollout_ref.rollout.prompt_length={self.rollout.prompt_length}; an image block "
                    "is never cut (raise data.max_prompt_length)"
                )
            grid = vision.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long))
            found = int((ids[i][mask[i].bool()] == token).sum())
            expected = int((grid.prod(-1) // merge**2).sum())
            if found != expected:
                raise ValueError(
                    f"row {i}: the sequence has {found} image tokens but its agent loop returned "
                    f"{len(grid)} image(s) for {expected} (AgentLoopOutput.multi_modal_inputs)"
                )
            positions.append(self.processor.position_ids(ids[i], mask[i], vision))
            column.append(vision)
        tensors["position_ids"] = torch.stack(positions)
        non_tensor[MULTI_MODAL_INPUTS] = _object_array(column)


def _prompt_ids(prompts: DataProto, i: int) -> list[int]:
    ids, mask = prompts.batch["input_ids"][i], prompts.batch["attention_mask"][i].bool()
    return ids[mask].tolist()


def _first_version(versions: torch.Tensor) -> torch.Tensor:
    """Per row, the version of its first model token (0 for a row without one)."""
    valid = versions >= 0
    first = valid.float().argmax(dim=-1)
    return torch.where(valid.any(-1), versions.gather(1, first[:, None])[:, 0], 0)


def _object_array(values: list[Any]) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def _metrics(outputs: list[AgentLoopOutput]) -> dict[str, float]:
    turns = [o.num_turns for o in outputs]
    metrics = {"agent/num_turns/mean": float(np.mean(turns)), "agent/num_turns/max": float(max(turns))}
    keys = sorted({k for o in outputs for k in o.metrics})
    for key in keys:
        metrics[f"agent/{key}"] = float(sum(o.metrics.get(key, 0.0) for o in outputs))
    return metrics
