"""Interactions: a simulated user that answers the policy between turns of a multi-turn rollout.

An interaction (a :class:`verl.interactions.base.BaseInteraction` subclass) is listed in the YAML
named by ``actor_rollout_ref.rollout.multi_turn.interaction_config_path`` and picked per row by
``extra_info.interaction_kwargs.name``; the ``tool_agent`` loop asks it for the user's reply after
each model turn without a tool call (docs/agents.md, "Interactions").
"""
