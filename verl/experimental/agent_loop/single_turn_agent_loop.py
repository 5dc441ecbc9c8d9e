"""``single_turn_agent``: one generation for the row's prompt (the default agent loop)."""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl.workers.vision import MULTI_MODAL_INPUTS


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    takes_images = True

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if kwargs.get("raw_prompt") is not None:
            prompt_ids, vision = self.render_prompt(kwargs)
        else:  # the dataset's rendering (image blocks expanded), as the batched rollout sees it
            prompt_ids, vision = list(kwargs["raw_prompt_ids"]), dict(kwargs.get(MULTI_MODAL_INPUTS) or {})
        request_id = self.new_request_id()
        params = {**sampling_params, "max_tokens": self.rollout_config.response_length}
        out = await self.server_manager.generate(
            request_id, prompt_ids=prompt_ids, sampling_params=params, multi_modal_inputs=vision
        )
        self.server_manager.release(request_id)
        n = len(out.token_ids)
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=out.token_ids,
            response_mask=[1] * n,
            response_logprobs=out.log_probs,
            response_versions=out.versions,
            num_turns=2,
            multi_modal_inputs=vision,
        )
