"""verl's roles and the questions a driver asks of its config (``verl.trainer.ppo.utils``).

A recipe maps each :class:`Role` to a worker class and a resource pool; the trainer asks
:func:`need_reference_policy`, :func:`need_critic` and :func:`need_reward_model` which of them to
build.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from verl.single_controller import Worker

__all__ = ["Role", "WorkerType", "need_critic", "need_reference_policy", "need_reward_model"]

WorkerType = type[Worker]


class Role(Enum):
    """The roles a driver can place (verl's members and numbering); a subclass may add more."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6
    Env = 7

    def __str__(self) -> str:
        return _ROLE_NAMES.get(self, self.name.lower())

    @classmethod
    def from_string(cls, name: str) -> Role:
        """The role whose ``str()`` is ``name`` (case-insensitive)."""
        for role in cls:
            if str(role) == name.lower():
                return role
        raise ValueError(f"no Role is called {name!r}; known: {[str(r) for r in cls]}")


_ROLE_NAMES = {
    Role.Actor: "actor",
    Role.Rollout: "rollout",
    Role.ActorRollout: "actor_rollout",
    Role.Critic: "critic",
    Role.RefPolicy: "ref",
    Role.RewardModel: "rm",
    Role.ActorRolloutRef: "actor_rollout_ref",
}


def need_reference_policy(config: Any) -> bool:
    """A reference policy is needed for a KL term: in the reward or in the actor's loss."""
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def need_critic(config: Any) -> bool:
    """``critic.enable`` when set, else whether the advantage estimator needs values (GAE)."""
    if config.critic.enable is not None:
        return bool(config.critic.enable)
    return str(getattr(config.algorithm.adv_estimator, "value", config.algorithm.adv_estimator)) == "gae"


def need_reward_model(role_worker_mapping: dict[Role, Any]) -> bool:
    """A reward-model worker is built when the recipe maps :attr:`Role.RewardModel` to a class."""
    return Role.RewardModel in role_worker_mapping
