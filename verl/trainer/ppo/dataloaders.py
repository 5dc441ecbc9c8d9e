"""The driver's data: the train and validation loaders of ``data.*`` (with the model's image
processor when the policy is a vision-language model), and the roles such a policy can use here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.config.ppo_trainer import PPOTrainerConfig


@dataclass
class DataLoaders:
    train: Any
    val: Any
    val_dataset: Any


def build_dataloaders(
    config: PPOTrainerConfig,
    tokenizer,
    train_dataset: Any = None,
    val_dataset: Any = None,
    collate_fn: Any = None,
) -> DataLoaders:
    """The loaders of ``data.*``; a dataset given (verl's ``RayPPOTrainer(train_dataset=...)``, e.g.
    from ``create_rl_dataset``) replaces the one its files would make, and ``collate_fn`` the
    default collation."""
    from verl.utils.dataset.dataloader import create_rl_dataloader
    from verl.utils.dataset.rl_dataset import create_rl_dataset
    from verl.utils.dataset.vision import load_vision_processor

    data = config.data
    vision = load_vision_processor(config.actor_rollout_ref.model.path, tokenizer)
    if vision is not None:
        check_vision_roles(config)
    if train_dataset is None:
        train_dataset = create_rl_dataset(data.train_files, data, tokenizer, data.train_max_samples, vision)
    if val_dataset is None:
        val_dataset = create_rl_dataset(data.val_files, data, tokenizer, data.val_max_samples, vision)
    seed = data.seed if data.seed is not None else 1
    collate = {"collate_fn": collate_fn} if collate_fn is not None else {}
    train = create_rl_dataloader(
        train_dataset, data.train_batch_size, data.shuffle, seed, drop_last=True, **collate
    )
    val = create_rl_dataloader(
        val_dataset,
        data.val_batch_size or len(val_dataset),
        data.validation_shuffle,
        seed,
        drop_last=False,
        **collate,
    )
    if len(train) == 0:
        raise ValueError(
            f"data.train_files has {len(train_dataset)} rows, fewer than data.train_batch_size={data.train_batch_size}"
        )
    return DataLoaders(train=train, val=val, val_dataset=val_dataset)


def check_vision_roles(config: PPOTrainerConfig) -> None:
    """A vision-language policy runs where images reach the model: the hf rollout (vLLM and SGLang get
    no image inputs here yet, and vLLM's CPU build cannot load Qwen2-VL: its processor needs
    torchvision, which has no CPU build for this torch), no Ulysses (for the actor or the critic). A
    critic reads the images as the actor does (:mod:`verl.utils.vision_classifier`)."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "hf":
        raise ValueError(
            f"actor_rollout_ref.rollout.name={rollout.name}: a vision-language model "
            "(actor_rollout_ref.model.path) generates with rollout.name=hf here; image inputs are not "
            "passed to vLLM or SGLang yet (docs/vlm.md)"
        )
    sequence_parallel = {
        "actor_rollout_ref.actor": config.actor_rollout_ref.actor.ulysses_sequence_parallel_size
    }
    if config.use_critic:
        check_vision_critic(config)
        sequence_parallel["critic"] = config.critic.ulysses_sequence_parallel_size
    for section, size in sequence_parallel.items():
        if size > 1:
            raise ValueError(
                f"{section}.ulysses_sequence_parallel_size: sequence parallelism does not split M-RoPE "
                "positions yet; set it to 1 for a vision-language model"
            )


def check_vision_critic(config: PPOTrainerConfig) -> None:
    """The critic of a vision-language policy sees the rows' images: its model must read them too (a
    text model would get image tokens with no pictures behind them)."""
    from verl.utils.model import is_vision_language, load_hf_config

    critic = config.critic.model
    if not is_vision_language(load_hf_config(critic, "critic.model")):
        raise ValueError(
            f"critic.model.path={critic.path!r}: the policy (actor_rollout_ref.model.path) is a vision-language "
            "model, so the critic's rows hold images; use a vision-language critic model (by default the "
            "policy's own)"
        )
