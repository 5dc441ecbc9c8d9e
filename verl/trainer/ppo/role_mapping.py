"""verl's way to place the roles: a recipe maps each :class:`Role` to a worker class and names a
resource pool for it; roles that share a pool share its processes (the hybrid engine).

``build_mapped_worker_groups`` turns ``role_worker_mapping`` and a ``ResourcePoolManager`` into the
trainer's worker groups, named as :func:`verl.trainer.ppo.builders.build_worker_groups` names them
(``actor_rollout``, ``critic``, ``ref``, ``reward_model``), so the rest of the trainer does not know
which of the two built them. Each worker class gets the constructor arguments the project's own
workers take; a recipe's worker subclasses one of them.
"""

from __future__ import annotations

from typing import Any

from verl.config.ppo_trainer import PPOTrainerConfig
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, create_colocated_worker_groups
from verl.trainer.ppo import builders
from verl.trainer.ppo.utils import Role, need_critic, need_reference_policy

__all__ = ["build_mapped_worker_groups", "policy_role"]

INIT_ORDER = ("reward_model", "critic", "ref", "actor_rollout")
"""As verl: the rollout last, so an inference engine sizes its cache after the others are placed."""


def policy_role(mapping: dict[Role, Any]) -> Role:
    """The role that trains and generates: ``ActorRolloutRef`` if mapped, else ``ActorRollout``."""
    for role in (Role.ActorRolloutRef, Role.ActorRollout):
        if role in mapping:
            return role
    raise ValueError(
        f"role_worker_mapping needs Role.ActorRollout or Role.ActorRolloutRef (the hybrid engine), "
        f"got {[str(r) for r in mapping]}"
    )


def _class_dicts(
    config: PPOTrainerConfig, mapping: dict[Role, Any], pool_of: Any
) -> dict[str, dict[str, RayClassWithInitArgs]]:
    """Pool name -> {group name: the worker class with its arguments}."""
    actor = policy_role(mapping)
    separate_ref = need_reference_policy(config) and Role.RefPolicy in mapping
    # without a RefPolicy worker the reference lives in the policy's processes (verl's ActorRolloutRef)
    worker_role = (
        "actor_rollout_ref" if need_reference_policy(config) and not separate_ref else "actor_rollout"
    )
    wanted = {"actor_rollout": (actor, builders.policy_worker(config, worker_role, mapping[actor]))}
    if need_critic(config):
        if Role.Critic not in mapping:
            raise ValueError(
                "the config needs a critic (algorithm.adv_estimator=gae or critic.enable) "
                "but role_worker_mapping has no Role.Critic"
            )
        wanted["critic"] = (Role.Critic, builders.critic_worker(config, mapping[Role.Critic]))
    if separate_ref:
        wanted["ref"] = (Role.RefPolicy, builders.policy_worker(config, "ref", mapping[Role.RefPolicy]))
    if Role.RewardModel in mapping:
        if not config.reward_model.enable:
            raise ValueError("role_worker_mapping has Role.RewardModel but reward_model.enable=False")
        wanted["reward_model"] = (
            Role.RewardModel,
            builders.reward_model_worker(config, mapping[Role.RewardModel]),
        )
    dicts: dict[str, dict[str, RayClassWithInitArgs]] = {}
    for group, (role, spec) in wanted.items():
        dicts.setdefault(pool_of(role), {})[group] = spec
    return dicts


def build_mapped_worker_groups(
    config: PPOTrainerConfig, device: str, mapping: dict[Role, Any], pool_manager: Any
) -> tuple[dict[str, Any], list[RayResourcePool]]:
    """verl's ``init_workers``: the worker groups of ``mapping`` on the pools ``pool_manager`` names,
    models initialised; the pools are returned for the trainer to release."""
    trainer = config.trainer

    def pool_of(role: Role) -> str:
        if role not in pool_manager.mapping:
            raise ValueError(
                f"ResourcePoolManager.mapping has no pool for {role} (mapped: {list(pool_manager.mapping)})"
            )
        return pool_manager.mapping[role]

    class_dicts = _class_dicts(config, mapping, pool_of)
    pools: list[RayResourcePool] = []
    groups: dict[str, Any] = {}
    with builders.released_on_failure(pools, groups):
        for name, class_dict in class_dicts.items():
            pool = builders.pool(
                pool_manager.resource_pool_spec[name],
                device,
                name,
                trainer.cpus_per_worker,
                "resource_pool_spec",
            )
            pools.append(pool)
            groups.update(
                create_colocated_worker_groups(
                    pool,
                    class_dict,
                    call_timeout_s=trainer.worker_call_timeout_s,
                    setup_timeout_s=trainer.ray_wait_register_center_timeout,
                )
            )
        for name in INIT_ORDER:
            if name in groups:
                groups[name].init_model()
    return groups, pools
