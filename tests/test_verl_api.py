"""Every name of verl's API reference (its ``docs/api/{data,single_controller,trainer,utils}.rst``,
listed by hand below) and the names verl's recipes import most resolve from verl's import path and
have the documented members; checked by import and attribute lookup, so a renamed or moved name
fails here. Behaviour is tested beside each part (tests/test_protocol_verl.py,
tests/single_controller/test_verl_api.py, tests/trainer/ppo/test_core_algos_verl_api.py,
tests/utils/test_verl_utils_api.py, tests/workers/test_reward_manager_verl_api.py,
tests/recipe/test_verl_style_recipe.py)."""

from __future__ import annotations

import importlib
import inspect

import pytest

API_REFERENCE = {
    # docs/api/data.rst
    "verl.DataProto": ["to", "select", "union", "make_iterator", "concat"],
    # docs/api/single_controller.rst
    "verl.single_controller.Worker": [
        "__init__",
        "__new__",
        "get_master_addr_port",
        "get_cuda_visible_devices",
        "world_size",
        "rank",
    ],
    "verl.single_controller.WorkerGroup": ["__init__", "world_size"],
    "verl.single_controller.ClassWithInitArgs": ["__init__", "__call__"],
    "verl.single_controller.ResourcePool": [
        "__init__",
        "world_size",
        "local_world_size_list",
        "local_rank_list",
    ],
    "verl.single_controller.ray.RayWorkerGroup": ["__init__"],
    "verl.single_controller.ray.create_colocated_worker_cls": [],
    # docs/api/trainer.rst
    "verl.trainer.ppo.ray_trainer.RayPPOTrainer": ["__init__", "init_workers", "fit"],
    "verl.utils.tokenizer.hf_tokenizer": [],
    "verl.trainer.ppo.core_algos.agg_loss": [],
    "verl.trainer.ppo.core_algos.kl_penalty": [],
    "verl.trainer.ppo.core_algos.compute_policy_loss": [],
    "verl.trainer.ppo.reward.load_reward_manager": [],
    "verl.trainer.ppo.reward.compute_reward": [],
    "verl.trainer.ppo.reward.compute_reward_async": [],
    "verl.workers.reward_manager.NaiveRewardManager": ["__call__"],
    "verl.workers.reward_manager.DAPORewardManager": ["__call__"],
    # docs/api/utils.rst
    "verl.utils.py_functional.append_to_dict": [],
    "verl.utils.fs.copy_to_local": [],
    "verl.utils.tracking.Tracking": ["log"],
    "verl.utils.metric.reduce_metrics": [],
    "verl.utils.checkpoint.checkpoint_manager.find_latest_ckpt_path": [],
    "verl.utils.checkpoint.fsdp_checkpoint_manager.FSDPCheckpointManager": [],
    "verl.utils.dataset.rl_dataset.RLHFDataset": [],
    "verl.utils.dataset.rl_dataset.collate_fn": [],
    "verl.utils.torch_functional.get_constant_schedule_with_warmup": [],
    "verl.utils.torch_functional.masked_whiten": [],
    "verl.utils.torch_functional.masked_mean": [],
    "verl.utils.torch_functional.logprobs_from_logits": [],
    "verl.utils.seqlen_balancing.get_reverse_idx": [],
    "verl.utils.seqlen_balancing.rearrange_micro_batches": [],
    "verl.utils.ulysses.gather_outputs_and_unpad": [],
    "verl.utils.ulysses.ulysses_pad_and_slice_inputs": [],
    "verl.utils.fsdp_utils.get_fsdp_wrap_policy": [],
    "verl.utils.fsdp_utils.get_init_weight_context_manager": [],
    "verl.utils.fsdp_utils.init_fn": [],
    "verl.utils.fsdp_utils.load_fsdp_model_to_gpu": [],
    "verl.utils.fsdp_utils.load_fsdp_optimizer": [],
    "verl.utils.fsdp_utils.offload_fsdp_model_to_cpu": [],
    "verl.utils.fsdp_utils.offload_fsdp_optimizer": [],
    "verl.utils.profiler.log_gpu_memory_usage": [],
    "verl.utils.profiler.GPUMemoryLogger": [],
}
"""verl's API reference: name -> the members it documents."""

RECIPE_NAMES = {
    "verl.__version__": [],
    "verl.DataProtoFuture": ["get"],
    "verl.protocol.DataProto": ["chunk", "repeat", "pop", "from_single_dict", "from_dict", "to_tensordict"],
    "verl.single_controller.base.Worker": [],
    "verl.single_controller.base.decorator.register": [],
    "verl.single_controller.base.decorator.Dispatch": [
        "DP_COMPUTE_PROTO",
        "ONE_TO_ALL",
        "ALL_TO_ALL",
        "RANK_ZERO",
    ],
    "verl.single_controller.base.decorator.Execute": ["ALL", "RANK_ZERO"],
    "verl.single_controller.ray.RayResourcePool": [],
    "verl.single_controller.ray.RayClassWithInitArgs": [],
    "verl.single_controller.ray.base.create_colocated_worker_cls": [],
    "verl.trainer.ppo.ray_trainer.ResourcePoolManager": ["create_resource_pool", "get_resource_pool"],
    "verl.trainer.ppo.ray_trainer.Role": [
        "ActorRollout",
        "ActorRolloutRef",
        "Critic",
        "RefPolicy",
        "RewardModel",
    ],
    "verl.trainer.ppo.ray_trainer.compute_advantage": [],
    "verl.trainer.ppo.ray_trainer.apply_kl_penalty": [],
    "verl.trainer.ppo.ray_trainer.compute_response_mask": [],
    "verl.trainer.ppo.utils.Role": [],
    "verl.trainer.ppo.utils.need_reference_policy": [],
    "verl.trainer.ppo.utils.need_critic": [],
    "verl.trainer.ppo.metric_utils.compute_data_metrics": [],
    "verl.trainer.ppo.metric_utils.compute_timing_metrics": [],
    "verl.trainer.ppo.metric_utils.compute_throughout_metrics": [],
    "verl.trainer.ppo.core_algos.AdvantageEstimator": ["GAE", "GRPO"],
    "verl.trainer.ppo.core_algos.register_adv_est": [],
    "verl.trainer.ppo.core_algos.get_adv_estimator_fn": [],
    "verl.trainer.ppo.core_algos.register_policy_loss": [],
    "verl.trainer.ppo.core_algos.get_policy_loss_fn": [],
    "verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage": [],
    "verl.trainer.ppo.core_algos.compute_gae_advantage_return": [],
    "verl.workers.reward_manager.register": [],
    "verl.workers.reward_manager.get_reward_manager_cls": [],
    "verl.workers.reward_manager.PrimeRewardManager": [],
    "verl.workers.reward_manager.BatchRewardManager": [],
    "verl.utils.reward_score.default_compute_score": [],
    "verl.workers.fsdp_workers.ActorRolloutRefWorker": [
        "generate_sequences",
        "compute_log_prob",
        "update_actor",
    ],
    "verl.workers.fsdp_workers.CriticWorker": ["compute_values", "update_critic"],
    "verl.workers.fsdp_workers.RewardModelWorker": [],
    "verl.workers.megatron_workers.ActorRolloutRefWorker": [],
    "verl.workers.config.ActorConfig": [],
    "verl.workers.config.CriticConfig": [],
    "verl.workers.config.RolloutConfig": [],
    "verl.workers.config.FSDPEngineConfig": [],
    "verl.trainer.config.AlgoConfig": ["get"],
    "verl.trainer.config.KLControlConfig": [],
    "verl.base_config.BaseConfig": ["get"],
    "verl.utils.config.omega_conf_to_dataclass": [],
    "verl.utils.hf_tokenizer": [],
    "verl.utils.hf_processor": [],
    "verl.utils.device.get_device_name": [],
    "verl.utils.hdfs_io.makedirs": [],
    "verl.experimental.agent_loop.AgentLoopBase": ["run"],
    "verl.experimental.agent_loop.register": [],
    "verl.tools.base_tool.BaseTool": ["create", "execute", "calc_reward", "release"],
    "verl.tools.schemas.OpenAIFunctionToolSchema": [],
    "verl.interactions.base.BaseInteraction": [
        "start_interaction",
        "generate_response",
        "calculate_score",
        "finalize_interaction",
    ],
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": [],
    "verl.interactions.utils.interaction_registry.initialize_interactions_from_config": [],
    "verl.interactions.utils.interaction_registry.get_interaction_class": [],
}
"""Names verl's recipes import beyond the reference, with the members they use."""


def resolve(dotted: str):
    """The object at ``dotted``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize(("name", "members"), {**API_REFERENCE, **RECIPE_NAMES}.items())
def test_a_verl_name_resolves_from_its_verl_path_with_its_members(name, members):
    obj = resolve(name)
    assert obj is not None
    missing = [m for m in members if not hasattr(obj, m)]
    assert not missing, f"{name} lacks {missing}"


def test_the_verl_paths_hold_the_projects_own_objects_not_copies():
    from verl import DataProto
    from verl.protocol import DataProto as ProjectDataProto
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker as ProjectWorker
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    assert DataProto is ProjectDataProto
    assert ActorRolloutRefWorker is ProjectWorker
    assert inspect.getmodule(compute_grpo_outcome_advantage).__name__.startswith("verl.algorithms")


def test_the_trainers_constructor_takes_verls_arguments_in_verls_order():
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    params = list(inspect.signature(RayPPOTrainer.__init__).parameters)[1:]
    assert params == [
        "config",
        "tokenizer",
        "role_worker_mapping",
        "resource_pool_manager",
        "ray_worker_group_cls",
        "processor",
        "reward_fn",
        "val_reward_fn",
        "train_dataset",
        "val_dataset",
        "collate_fn",
        "train_sampler",
        "device_name",
    ]


def test_a_config_section_reads_like_verls_dict_config():
    from verl.config.ppo_trainer import PPOTrainerConfig

    config = PPOTrainerConfig()
    assert config.trainer.get("val_before_train", None) is config.trainer.val_before_train
    assert config.trainer["total_epochs"] == config.trainer.total_epochs
    assert config.algorithm.get("no_such_key", "fallback") == "fallback"
    assert "kl_ctrl" in config.algorithm and "no_such_key" not in config.algorithm
    with pytest.raises(KeyError, match="no_such_key"):
        config.algorithm["no_such_key"]
