"""``openai_agent``: train an agent written for the ``openai`` client, without rewriting it.

Register it with the agent function in ``rollout.agent.agent_loop_config_path``::

    - name: my_agent
      _target_: verl.experimental.agent_loop.openai_agent_loop.OpenAIAgentLoop
      function: my_package.agents.solve        # async def solve(client, **row) -> float

and name it per row (``agent_name`` column) or as ``rollout.agent.default_agent_loop``. For each
row the function gets an ``openai.AsyncOpenAI`` client whose base URL is a fresh episode of the
recording endpoint (:mod:`.chat_proxy`) and the row's columns (``raw_prompt``, ``extra_info``,
``reward_model``, ...); it talks to the model as it likes (chat completions, tool calls) and
returns the episode's reward (a number, or a dict with ``reward``). The recorded completions
become the sample (token ids and log-probs as generated), and the reward becomes its score
(``rm_scores``: the reward manager is not called for it).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, import_object, register


@register("openai_agent")
class OpenAIAgentLoop(AgentLoopBase):
    def __init__(
        self, *args: Any, function: str | None = None, chat_proxy: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        where = "actor_rollout_ref.rollout.agent.agent_loop_config_path (openai_agent)"
        if not function:
            raise ValueError(f"{where}: the entry needs `function: package.module.async_function`")
        self.function = import_object(function, where)
        self.chat_proxy = chat_proxy

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        import openai

        episode_id, base_url = self.chat_proxy.open_episode(sampling_params.get("seed"))
        # the endpoint is on loopback: a proxy from the environment must not reroute it
        http_client = openai.DefaultAsyncHttpxClient(trust_env=False)
        client = openai.AsyncOpenAI(base_url=base_url, api_key="verl", max_retries=0, http_client=http_client)
        try:
            result = await self.function(client, **kwargs)
        finally:
            await client.close()
            episode = self.chat_proxy.close_episode(episode_id)
        reward = result.get("reward") if isinstance(result, dict) else result
        if not isinstance(reward, (int, float)):
            raise TypeError(
                f"the agent function {self.function.__name__} returned {result!r}; expected its reward"
            )
        return AgentLoopOutput(
            prompt_ids=episode.prompt_ids,
            response_ids=episode.chain.response_ids,
            response_mask=episode.chain.mask,
            response_logprobs=episode.chain.log_probs,
            response_versions=episode.chain.versions,
            reward_score=float(reward),
            num_turns=1 + 2 * episode.chain_completions,
            metrics={
                "openai_completions": float(episode.completions),
                "openai_dropped_completions": float(episode.completions - episode.chain_completions),
            },
        )
