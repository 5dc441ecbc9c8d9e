"""Agent loops over the rollout servers (``actor_rollout_ref.rollout.mode=async``)."""

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, TokenOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

__all__ = [
    "AgentLoopBase",
    "AgentLoopOutput",
    "SingleTurnAgentLoop",
    "TokenOutput",
    "ToolAgentLoop",
    "register",
]
