"""The ``megatron`` sections of ``strategy=megatron``: actor, reference and critic parallelism.

``actor_rollout_ref.actor.megatron``, ``actor_rollout_ref.ref.megatron`` and ``critic.megatron`` hold
verl's Megatron engine keys (verl 0.9.1's ``engine/megatron.yaml``; ``grad_offload`` from verl 0.8)
with verl's defaults. The engine (``verl/workers/engine/megatron``) reads the parallel sizes, the
seed, ``sequence_parallel``, ``use_distributed_optimizer`` and ``override_transformer_config``.
:data:`NOT_YET` lists the keys whose feature the engine lacks: set away from their default they are
refused at start-up (:func:`refuse_not_yet`, from :func:`refuse_megatron_not_yet` for PPO runs);
drop an entry when its feature lands. Keys that only
steer verl's own implementation are listed in :data:`INERT_FIELDS` (noted in the log when given).
The reference runs in the actor's processes, so its parallel sizes follow the actor's
(:func:`ref_megatron`), as verl's ``ref/megatron_ref.yaml`` interpolates them; so do the critic's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from verl.config.base import BaseConfig, ConfigError, at_least, check, check_choice, check_ranges, ranged
from verl.config.keypaths import get_key

STRATEGIES = ("fsdp", "fsdp2", "megatron")
"""The values of ``actor.strategy``, ``ref.strategy`` and ``critic.strategy``."""
MEGATRON = "megatron"
MEGATRON_DTYPES = ("bfloat16", "float16")


def _transformer_overrides() -> dict[str, Any]:
    return {
        "recompute_granularity": None,
        "recompute_modules": ["core_attn"],
        "recompute_method": None,
        "recompute_num_layers": None,
        "attention_backend": "flash",
    }


@dataclass
class MegatronConfig(BaseConfig):
    tensor_model_parallel_size: int = ranged(1, at_least(1))
    """Ranks that split each layer's weights (megatron-core tensor parallelism); TP x PP must divide the
    role's ranks, and the rest is data parallelism."""
    pipeline_model_parallel_size: int = ranged(1, at_least(1))
    """Ranks that split the layers into consecutive stages (1F1B pipeline schedule)."""
    virtual_pipeline_model_parallel_size: int | None = ranged(None, at_least(1))
    """Model chunks per pipeline stage (interleaved schedule). Refused above 1: not implemented yet."""
    context_parallel_size: int = ranged(1, at_least(1))
    """Ranks that split each sequence in attention. Refused above 1: megatron-core's local layer spec
    (no Transformer Engine) has no context-parallel attention."""
    expert_model_parallel_size: int = ranged(1, at_least(1))
    """Ranks that split a MoE layer's experts (Qwen3-MoE, Mixtral); taken from the data-parallel ranks
    as in megatron-core: it must divide the experts, and expert_tensor_parallel_size x this x PP the
    role's ranks. Above 1 on a dense model: refused."""
    expert_tensor_parallel_size: int | None = ranged(None, at_least(1))
    """Tensor parallelism inside each expert (null: the tensor_model_parallel_size, as megatron-core).
    Only 1 is accepted for a MoE model: split experts were mis-updated by megatron-core 0.16.1 here."""
    sequence_parallel: bool = True
    """Split the activations outside attention and MLP over the tensor-parallel ranks. Needs
    tensor_model_parallel_size > 1: at 1 it is turned off at start-up, as verl does."""
    use_distributed_optimizer: bool = True
    """Shard the optimizer state (and fp32 master weights) over the data-parallel ranks (ZeRO-1)."""
    use_dist_checkpointing: bool = False
    """Load the initial weights from the megatron-core distributed checkpoint at dist_checkpointing_path
    (written once by scripts/converter_hf_to_mcore.py) instead of converting model.path's Hugging Face
    weights; it loads at any tensor/pipeline layout. model.path still gives the config and tokenizer
    (and a critic's value head, which a causal LM's checkpoint lacks)."""
    dist_checkpointing_path: str | None = None
    """The distributed checkpoint's folder (read when use_dist_checkpointing; one that is missing, not
    a distributed checkpoint or of another model is an error naming this key)."""
    dist_checkpointing_prefix: str = ""
    """A prefix on the distributed checkpoint's keys (NeMo 2 writes 'module.'), read with
    use_dist_checkpointing."""
    dist_ckpt_optim_fully_reshardable: bool = False
    """verl: write reshardable optimizer state into distributed checkpoints. No effect here."""
    distrib_optim_fully_reshardable_mem_efficient: bool = False
    """verl: the memory-saving form of the reshardable format. No effect here."""
    dynamic_context_parallel: bool = False
    """verl: choose the context-parallel split per batch. Refused when True (context parallelism is)."""
    max_seqlen_per_dp_cp_rank: int | None = ranged(None, at_least(1))
    """verl: the token budget of dynamic_context_parallel. No effect here."""
    seed: int = ranged(42, at_least(0))
    """Seed of megatron-core's tensor-parallel RNG tracker (dropout and initialisation per rank)."""
    param_offload: bool = False
    """Keep the weights (megatron's DDP param buffers, or every parameter of the reference) in host
    memory between uses: each forward pass, update, weight sync and checkpoint copies them to the
    device and back (verl/workers/engine/megatron/offload.py). On CPU the same copies happen, into
    another host tensor."""
    grad_offload: bool = False
    """verl 0.8: free the DDP grad buffers between updates (each update starts from zero gradients, so
    nothing is copied: they come back as zeros). No effect on the reference (no gradients)."""
    optimizer_offload: bool = False
    """Keep the optimizer state (Adam's moments; the fp32 main weights of a bf16/fp16 model) in host
    memory between updates (and checkpoints). No effect on the reference (no optimizer)."""
    override_transformer_config: dict[str, Any] = field(default_factory=_transformer_overrides)
    """Entries set on megatron-core's TransformerConfig (recompute_granularity, recompute_modules,
    num_layers_in_first_pipeline_stage, ...); the default is verl's."""
    override_ddp_config: dict[str, Any] = field(default_factory=dict)
    """Entries set on megatron-core's DistributedDataParallelConfig. Refused when not empty: the engine
    does not apply them yet."""
    override_mcore_model_config: dict[str, Any] = field(default_factory=dict)
    """Entries passed to the megatron-core model's constructor. Refused when not empty: the engine does
    not apply them yet."""
    use_mbridge: bool = True
    """verl: convert the Hugging Face weights with mbridge / Megatron-Bridge. No effect here: this
    project's own converter (verl/workers/engine/megatron/weights.py) always does it."""
    vanilla_mbridge: bool = False
    """verl: the legacy mbridge package instead of Megatron-Bridge (verl 0.8's default: True). No effect
    here (see use_mbridge)."""
    use_megatron_fsdp: bool = False
    """verl: shard the weights with Megatron-FSDP (ZeRO-3). Refused when True: not implemented here."""
    use_remove_padding: bool = True
    """verl: its Megatron engine's packed (thd) layout instead of padded rows. No effect here: the
    Megatron engine runs micro-batches padded whatever model.use_remove_padding says (the local layer
    spec's attention has no variable-length path; a packed row would cost more attention, not less)."""
    pad_bshd_to_minibatch_max: bool = True
    """verl: pad unpacked rows to the mini-batch's longest. No effect here."""
    pad_to_length: bool = False
    """verl: round packed micro-batches up to pad_to_length_bucket tokens. No effect here."""
    pad_to_length_bucket: int = ranged(512, at_least(1))
    """verl: the bucket of pad_to_length. No effect here."""
    entropy_from_logits_with_chunking: bool = False
    """verl: its engine's copy of the actor's key of that name. No effect here (the actor's is read)."""
    entropy_from_logits_chunk_size: int = ranged(2048, at_least(1))
    """verl: its engine's copy of the actor's key of that name. No effect here (the actor's is read)."""
    forward_only: bool = False
    """verl: build the engine without an optimizer (True in the reference's section). No effect here:
    the role decides (the reference only runs forward)."""
    dtype: str = "bfloat16"
    """On a GPU, the weights' and compute dtype (bfloat16 | float16), with fp32 master weights in the
    optimizer (megatron-core's mixed precision), as verl. On CPU the engine computes in the role's
    fsdp_config.model_dtype (default fp32), as the FSDP engine does there."""

    def validate(self, path: str) -> None:
        check_ranges(self, path)
        check_choice(self.dtype, MEGATRON_DTYPES, f"{path}.dtype")
        check(
            not self.use_dist_checkpointing or bool(self.dist_checkpointing_path),
            f"{path}.dist_checkpointing_path",
            "the distributed checkpoint's folder with use_dist_checkpointing=True",
            self.dist_checkpointing_path,
        )
        if self.tensor_model_parallel_size == 1:
            self.sequence_parallel = False  # verl's McoreEngineConfig does the same


def _one(value: int | None) -> bool:
    return value in (None, 1)


# field -> (is the value accepted, why not). Drop an entry when the engine implements it.
NOT_YET: dict[str, tuple[Callable[[Any], bool], str]] = {
    "context_parallel_size": (
        _one,
        "megatron-core's local layer spec (no Transformer Engine) has no context-parallel attention",
    ),
    "dynamic_context_parallel": (lambda v: not v, "context parallelism is not implemented here"),
    "virtual_pipeline_model_parallel_size": (
        _one,
        "the interleaved (virtual) pipeline schedule is not implemented yet; use pipeline_model_parallel_size",
    ),
    "use_megatron_fsdp": (lambda v: not v, "Megatron-FSDP is not implemented here"),
    "override_ddp_config": (lambda v: not v, "the engine does not apply DDP overrides yet"),
    "override_mcore_model_config": (lambda v: not v, "the engine does not apply model overrides yet"),
}
INERT_FIELDS = (
    "dist_ckpt_optim_fully_reshardable",
    "distrib_optim_fully_reshardable_mem_efficient",
    "max_seqlen_per_dp_cp_rank",
    "use_mbridge",
    "vanilla_mbridge",
    "use_remove_padding",
    "pad_bshd_to_minibatch_max",
    "pad_to_length",
    "pad_to_length_bucket",
    "entropy_from_logits_with_chunking",
    "entropy_from_logits_chunk_size",
    "forward_only",
)
"""Fields of :class:`MegatronConfig` that have no effect here (each one's doc says why)."""


def refuse_not_yet(config: MegatronConfig, path: str) -> None:
    """Raise a ConfigError naming the first key of :data:`NOT_YET` set to a value the engine lacks."""
    for name, (accepted, reason) in NOT_YET.items():
        value = getattr(config, name)
        if not accepted(value):
            default = getattr(MegatronConfig(), name)
            raise ConfigError(f"{path}.{name}={value!r}: {reason}. Leave it at verl's default ({default!r})")


_FOLLOW_ACTOR = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "dynamic_context_parallel",
    "max_seqlen_per_dp_cp_rank",
    "param_offload",
    "seed",
    "override_transformer_config",
    "use_mbridge",
    "vanilla_mbridge",
    "use_remove_padding",
    "pad_to_length",
    "pad_to_length_bucket",
)
"""The keys of ``ref.megatron`` that verl's ``megatron_ref.yaml`` takes from ``actor.megatron``."""
SECTIONS = {
    "actor_rollout_ref.actor.megatron": "actor_rollout_ref.actor",
    "actor_rollout_ref.ref.megatron": "actor_rollout_ref.ref",
    "critic.megatron": "critic",
}
"""The PPO config's Megatron sections -> the role section whose ``strategy`` selects them."""
INERT_KEYS = tuple(f"{section}.{name}" for section in SECTIONS for name in INERT_FIELDS)
"""Every Megatron section's keys that have no effect here."""
FSDP_SECTIONS = {
    "actor_rollout_ref.actor": "actor_rollout_ref.actor.fsdp_config",
    "actor_rollout_ref.ref": "actor_rollout_ref.ref.fsdp_config",
    "critic": "critic.model.fsdp_config",
}


def strategy_inert_keys(config: Any) -> list[str]:
    """The sections a role's strategy leaves unread: ``megatron`` under FSDP; under Megatron the FSDP
    section but its model_dtype (the dtype the weights are loaded and trained in)."""
    inert = []
    for section, role in SECTIONS.items():
        if get_key(config, f"{role}.strategy") != MEGATRON:
            inert.append(section)
            continue
        fsdp = FSDP_SECTIONS[role]
        inert += [
            f"{fsdp}.{f.name}" for f in dataclasses.fields(get_key(config, fsdp)) if f.name != "model_dtype"
        ]
    return inert


PARALLEL_SIZES = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
"""The layout colocated roles share: megatron-core keeps one set of groups per process."""


def ref_megatron() -> MegatronConfig:
    """The reference's section: the actor's parallel sizes, seed and overrides (verl's interpolations);
    forward only."""
    actor = "actor_rollout_ref.actor.megatron"
    follow = {name: II(f"{actor}.{name}") for name in _FOLLOW_ACTOR}
    return MegatronConfig(**follow, forward_only=True)


def critic_megatron() -> MegatronConfig:
    """The critic's section: verl writes 1 for its parallel sizes; here they follow the actor's, since
    the critic runs in the actor's processes, where megatron-core holds one layout."""
    actor = "actor_rollout_ref.actor.megatron"
    return MegatronConfig(**{name: II(f"{actor}.{name}") for name in PARALLEL_SIZES})


def _megatron_roles(config: Any) -> tuple[dict[str, tuple[str, MegatronConfig]], dict[str, MegatronConfig]]:
    """The PPO roles with their strategy and section, and the Megatron sections among them by key."""
    arr, critic = config.actor_rollout_ref, config.critic
    roles = {
        "actor_rollout_ref.actor": (arr.actor.strategy, arr.actor.megatron),
        "actor_rollout_ref.ref": (arr.ref.strategy, arr.ref.megatron),
    }
    if config.use_critic:
        roles["critic"] = (critic.strategy, critic.megatron)
    megatron = {
        f"{key}.megatron": section for key, (strategy, section) in roles.items() if strategy == MEGATRON
    }
    return roles, megatron


def refuse_megatron_not_yet(config: Any) -> None:
    """At start-up: the refusals of :data:`NOT_YET` for each Megatron role, a layout that fits the run's
    ranks (TP x PP, and the experts' ETP x EP x PP, dividing them), and one tensor/pipeline layout
    for the roles that share processes (megatron-core holds one per process)."""
    _, megatron = _megatron_roles(config)
    ranks = config.trainer.n_gpus_per_node * config.trainer.nnodes
    for key, section in megatron.items():
        refuse_not_yet(section, key)
        tp, pp = section.tensor_model_parallel_size, section.pipeline_model_parallel_size
        check(
            ranks % (tp * pp) == 0,
            f"{key}.tensor_model_parallel_size",
            f"a size that times pipeline_model_parallel_size ({pp}) divides the {ranks} ranks "
            "(trainer.n_gpus_per_node x trainer.nnodes)",
            tp,
        )
        ep, etp = section.expert_model_parallel_size, section.expert_tensor_parallel_size or tp
        check(
            ranks % (etp * ep * pp) == 0,
            f"{key}.expert_model_parallel_size",
            f"a size that times expert_tensor_parallel_size ({etp}) and pipeline_model_parallel_size ({pp}) "
            f"divides the {ranks} ranks",
            ep,
        )
    first = next(iter(megatron), None)
    for key, section in megatron.items():
        for name in PARALLEL_SIZES:
            want = getattr(megatron[first], name)
            check(
                getattr(section, name) == want,
                f"{key}.{name}",
                f"{want}, as {first}.{name} (these roles share processes, and megatron-core holds one "
                "layout per process)",
                getattr(section, name),
            )


def check_megatron_roles(config: Any) -> None:
    """The cross-role rules of ``strategy=megatron`` on a PPO config: no Ulysses sequence parallelism
    under Megatron, and LoRA's targets (the layout the run's ranks and the engine can hold is
    checked at start-up: :func:`refuse_megatron_not_yet`)."""
    arr, critic = config.actor_rollout_ref, config.critic
    roles, _ = _megatron_roles(config)
    for key, sp in (
        ("actor_rollout_ref.actor", arr.actor.ulysses_sequence_parallel_size),
        ("critic", critic.ulysses_sequence_parallel_size),
    ):
        check(
            roles.get(key, ("", None))[0] != MEGATRON or sp == 1,
            f"{key}.ulysses_sequence_parallel_size",
            "1 with strategy=megatron (Megatron splits activations with megatron.sequence_parallel)",
            sp,
        )
    if arr.actor.strategy == MEGATRON and (arr.model.lora_rank or arr.model.lora_adapter_path):
        check_megatron_lora(arr.model, "actor_rollout_ref.model")


LORA_TARGETS = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
"""The Megatron engine's LoRA targets (megatron-core's linears) and the HF linears each fuses."""


def check_megatron_lora(model: Any, key: str) -> None:
    """LoRA on the Megatron engine: ``lora_rank`` > 0 with the targets :func:`megatron_lora_targets`
    reads; a saved adapter (``lora_adapter_path``) and ``exclude_modules`` are refused."""
    check(
        not model.lora_adapter_path,
        f"{key}.lora_adapter_path",
        "null with strategy=megatron (loading a saved peft adapter into megatron's fused linears is not "
        "implemented; train it with strategy=fsdp, or start a new adapter with lora_rank)",
        model.lora_adapter_path,
    )
    check(
        not model.exclude_modules,
        f"{key}.exclude_modules",
        "null with strategy=megatron (name the adapted linears in target_modules instead)",
        model.exclude_modules,
    )
    megatron_lora_targets(model.target_modules, f"{key}.target_modules")


def megatron_lora_targets(value: Any, key: str) -> tuple[str, ...]:
    """``target_modules`` as megatron targets: ``all-linear`` (all four), megatron names, or the HF
    names of FSDP configs (``q_proj``/``k_proj``/``v_proj`` -> ``linear_qkv``, ``o_proj`` ->
    ``linear_proj``, ``gate_proj``/``up_proj`` -> ``linear_fc1``, ``down_proj`` -> ``linear_fc2``); a
    fused layer's HF names come together. Raises ``ConfigError`` naming ``key``."""
    if value is None or value == "all-linear":
        return tuple(LORA_TARGETS)
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else [str(n) for n in value]
    given, hf_names = {n for n in names if n}, [n for hf in LORA_TARGETS.values() for n in hf]
    unknown = sorted(given - set(LORA_TARGETS) - set(hf_names))
    check(
        not unknown,
        key,
        f"all-linear or names among {list(LORA_TARGETS)} or their HF names {hf_names}",
        unknown,
    )
    out = []
    for target, hf in LORA_TARGETS.items():
        partial = given & set(hf)
        check(
            not partial or partial == set(hf),
            key,
            f"all of {list(hf)} or none (megatron fuses them in {target}: one adapter)",
            sorted(partial),
        )
        if target in given or partial:
            out.append(target)
    check(bool(out), key, "at least one linear layer to adapt", value)
    return tuple(out)
