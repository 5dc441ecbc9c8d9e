"""verl's third engine family, VeOmni (``model_engine=veomni``), on this project's FSDP2 engine.

verl 0.9.1's VeOmni engine shards the model with FSDP2, as this project's ``fsdp``/``fsdp2`` engine
does, so a VeOmni run trains here with that engine. The selector's preset
(``verl/trainer/config/model_engine/veomni.yaml``) sets each role's ``strategy`` to ``veomni`` as
verl's does (and verl's VeOmni default schedule, cosine); at start-up :func:`convert_veomni` puts
the roles on ``veomni`` onto ``fsdp2`` with one log note, and for those roles reads their
``veomni.*`` section (verl 0.9.1's ``engine/veomni.yaml``) and the VeOmni optimizer's extra keys:

* :data:`CONVERTED`: same meaning here; a value away from verl's default lands on the key read here
  (set both ways to different values is refused, naming both keys);
* :data:`REFUSED`: a feature this project lacks; away from verl's default it is a one-line error;
* :data:`INERT`: a knob of VeOmni's own implementation; listed once in the log as having no effect.

The reference follows the actor's ``param_offload`` and ``ulysses_parallel_size`` unless given its
own, as verl's ``ref/veomni_ref.yaml`` interpolates them. Under another engine the ``veomni.*``
keys are inert, as ``megatron.*`` is under FSDP. These keys are not in ``verl091_keys.json`` (it
records verl's default engine); :func:`veomni_keys` lists them for the command line's routing.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from verl.config.base import check
from verl.config.keypaths import get_key, set_key

VEOMNI = "veomni"
ENGINE = "fsdp2"
"""The strategy a role on VeOmni trains with here."""

FIELD_DEFAULTS: dict[str, Any] = {  # verl 0.9.1's engine/veomni.yaml
    "param_offload": False,
    "optimizer_offload": False,
    "fsdp_size": -1,
    "ulysses_parallel_size": 1,
    "expert_parallel_size": 1,
    "mixed_precision": True,
    "seed": 42,
    "full_determinism": False,
    "init_device": "meta",
    "enable_full_shard": True,
    "ckpt_manager": "dcp",
    "load_checkpoint_path": None,
    "forward_prefetch": True,
    "strategy": VEOMNI,
    "use_torch_compile": False,
    "entropy_from_logits_with_chunking": False,
    "entropy_checkpointing": False,
    "forward_only": False,
    "enable_fsdp_offload": False,
    "enable_reentrant": False,
    "attn_implementation": "flash_attention_2",
    "moe_implementation": "fused",
    **{
        f"{kernel}_implementation": "eager"
        for kernel in (
            "cross_entropy_loss",
            "rms_norm",
            "swiglu_mlp",
            "rotary_pos_emb",
            "rms_norm_gated",
            "causal_conv1d",
            "chunk_gated_delta_rule",
            "load_balancing_loss",
            "dsa_indexer",
            "dsa_attention",
            "mhc",
        )
    },
    "qat_implementation": "none",
    "force_use_huggingface": False,
    "enable_async_activation_offload": False,
    "activation_offload_modules": [],
    "activation_offload_host_cache_limit_gb": 4.0,
    "basic_modules": [],
    "pad_to_length": False,
    "pad_to_length_bucket": 1024,
    "router_replay.mode": "disabled",
}
OPTIM_DEFAULTS: dict[str, Any] = {"lr_min": 0.0, "lr_start": 0.0, "lr_decay_ratio": 1.0}
"""The VeOmni optimizer's keys that verl's default one lacks (verl 0.9.1's optim/veomni.yaml)."""

# field -> the key it lands on, relative to the role's FSDP section ("" = the role's Ulysses key)
CONVERTED: dict[str, str] = {
    "param_offload": "param_offload",
    "optimizer_offload": "optimizer_offload",
    "enable_full_shard": "reshard_after_forward",  # False: ZeRO-2, gathered weights kept until backward
    "mixed_precision": "model_dtype",  # False: the weights held and trained in bf16
    "ulysses_parallel_size": "",
}
REFUSED: dict[str, str] = {
    "expert_parallel_size": "expert parallelism is not implemented (MoE models are trained dense)",
    "router_replay.mode": "MoE router replay is not implemented",
    "qat_implementation": "quantization-aware training is not implemented",
}
OPTIM_REFUSED: dict[str, str] = {
    "lr_start": "warmup starts from the cosine floor (optim.min_lr_ratio x lr), from 0 with constant",
    "lr_decay_ratio": "the cosine decays over all steps after warmup (optim.num_cycles sets its shape)",
}
_KERNELS = "a kernel choice of VeOmni's patched models; this engine runs the Hugging Face model"
INERT: dict[str, str] = {
    "fsdp_size": "every role shards over all its ranks (as fsdp_config.fsdp_size)",
    "seed": "as fsdp_config.seed",
    "full_determinism": "as fsdp_config.full_determinism",
    "init_device": "the engine loads the weights itself",
    "ckpt_manager": "checkpoints are this project's own format",
    "load_checkpoint_path": "verl does not read it either; resume with trainer.resume_mode",
    "forward_prefetch": "FSDP2 prefetches by itself (as fsdp_config.forward_prefetch)",
    "strategy": "the role's strategy selects the engine",
    "use_torch_compile": "as actor.use_torch_compile",
    "entropy_from_logits_with_chunking": "the actor's key of that name is read",
    "entropy_checkpointing": "the actor's key of that name is read",
    "forward_only": "the role decides (the reference only runs forward)",
    "enable_fsdp_offload": "as fsdp_config.offload_policy; use veomni.param_offload",
    "enable_reentrant": "gradient checkpointing is torch's non-reentrant one",
    "attn_implementation": "the engine picks the kernel; force one with model.override_config.attn_implementation",
    "moe_implementation": _KERNELS,
    **{name: _KERNELS for name in FIELD_DEFAULTS if name.endswith("_implementation") and name not in REFUSED},
    "force_use_huggingface": "the Hugging Face model is always used",
    "enable_async_activation_offload": "activation offload is not implemented (as model.enable_activation_offload)",
    "activation_offload_modules": "activation offload is not implemented",
    "activation_offload_host_cache_limit_gb": "activation offload is not implemented",
    "basic_modules": "each decoder layer is its own FSDP unit (fsdp_config.wrap_policy)",
    "pad_to_length": "packed micro-batches are not padded to buckets (as fsdp_config.pad_to_length)",
    "pad_to_length_bucket": "packed micro-batches are not padded to buckets",
}
# the role's section -> (its FSDP section, its Ulysses key, its optimizer section or None)
ROLES: dict[str, tuple[str, str, str | None]] = {
    "actor_rollout_ref.actor": (
        "actor_rollout_ref.actor.fsdp_config",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        "actor_rollout_ref.actor.optim",
    ),
    "actor_rollout_ref.ref": (
        "actor_rollout_ref.ref.fsdp_config",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
        None,
    ),
    "critic": ("critic.model.fsdp_config", "critic.ulysses_sequence_parallel_size", "critic.optim"),
}
FOLLOW_ACTOR = ("param_offload", "ulysses_parallel_size")
"""The reference's fields that take the actor's value unless given (verl's veomni_ref.yaml)."""
TARGET_DEFAULTS = {"param_offload": False, "optimizer_offload": False, "reshard_after_forward": True}
"""The schema's defaults of the FSDP keys :data:`CONVERTED` lands on (model_dtype: None, Ulysses: 1)."""


class Move(NamedTuple):
    """A value given as a verl key, to be put on the key read here."""

    key: str
    """The key given (verl's)."""
    given: Any
    """Its value."""
    target: str
    """The key read here."""
    value: Any
    """The value ``target`` takes."""
    default: Any
    """``target``'s default in the schema: a value set there apart from it and ``value`` is refused."""


def veomni_keys() -> dict[str, Any]:
    """Every key of verl's VeOmni engine config that the default one lacks, with verl's default."""
    keys = {f"{role}.{VEOMNI}.{name}": value for role in ROLES for name, value in FIELD_DEFAULTS.items()}
    for optim in (section for _, _, section in ROLES.values() if section):
        keys.update({f"{optim}.{name}": value for name, value in OPTIM_DEFAULTS.items()})
    return keys


Refusal = tuple[str, Any, str, Any]
"""(the VeOmni key, its value, why it is refused, verl's default)."""


def convert_veomni(config: Any, given: dict[str, Any]) -> tuple[list[str], list[Move], list[Refusal]]:
    """Put the roles on VeOmni onto :data:`ENGINE`; return the log note, the moves of their keys
    given away from verl's default onto the keys read here, and the refusals among them."""
    roles = [role for role in ROLES if get_key(config, f"{role}.strategy") == VEOMNI]
    moves: list[Move] = []
    refusals: list[Refusal] = []
    for role in roles:
        fields = _given_fields(role, given)
        refusals += [
            (key, value, REFUSED[name], FIELD_DEFAULTS[name])
            for name, (key, value) in fields.items()
            if name in REFUSED
        ]
        moves += _field_moves(role, fields)
        moves += _optim_moves(config, role, given, refusals)
        set_key(config, f"{role}.strategy", ENGINE)
    if not roles:
        return [], [], []
    note = (
        f"model_engine=veomni (strategy=veomni: {', '.join(roles)}) -> strategy={ENGINE}, this project's "
        f"FSDP2 engine (VeOmni shards with FSDP2 too); veomni.{{{', '.join(CONVERTED)}}} and optim.lr_min "
        "are converted when given, the other veomni.* keys are implementation knobs listed as inert"
    )
    return [note], moves, refusals


def _given_fields(role: str, given: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """The role's VeOmni fields given away from verl's default: name -> (the key given, value). The
    reference takes the actor's :data:`FOLLOW_ACTOR` fields unless given its own."""
    sources = [role]
    if role == "actor_rollout_ref.ref":
        sources.insert(0, "actor_rollout_ref.actor")
    found: dict[str, tuple[str, Any]] = {}
    for source in sources:
        for name in FIELD_DEFAULTS:
            key = f"{source}.{VEOMNI}.{name}"
            if key in given and (source == role or name in FOLLOW_ACTOR):
                found[name] = (key, given[key])
    return {name: (key, value) for name, (key, value) in found.items() if value != FIELD_DEFAULTS[name]}


def _field_moves(role: str, fields: dict[str, tuple[str, Any]]) -> list[Move]:
    fsdp, ulysses, _ = ROLES[role]
    moves = []
    for name, (key, value) in fields.items():
        target = CONVERTED.get(name)
        if target == "":
            moves.append(Move(key, value, ulysses, value, 1))
        elif target == "model_dtype":  # only False is away from the default: pure bf16 weights
            moves.append(Move(key, value, f"{fsdp}.model_dtype", "bf16", None))
        elif target is not None:
            moves.append(Move(key, value, f"{fsdp}.{target}", value, TARGET_DEFAULTS[target]))
    return moves


def _optim_moves(config: Any, role: str, given: dict[str, Any], refusals: list[Refusal]) -> list[Move]:
    """``optim.lr_min`` -> ``optim.min_lr_ratio`` (the cosine's floor as a fraction of lr); the
    VeOmni optimizer's other keys away from their default are added to ``refusals``."""
    optim = ROLES[role][2]
    if optim is None:
        return []
    for name, reason in OPTIM_REFUSED.items():
        key = f"{optim}.{name}"
        if key in given and given[key] != OPTIM_DEFAULTS[name]:
            refusals.append((key, given[key], reason, OPTIM_DEFAULTS[name]))
    key = f"{optim}.lr_min"
    lr_min, lr = given.get(key, 0.0), get_key(config, f"{optim}.lr")
    if lr_min == OPTIM_DEFAULTS["lr_min"]:
        return []
    check(0 <= lr_min <= lr, key, f"a learning rate from 0 to {optim}.lr ({lr})", lr_min)
    return [Move(key, lr_min, f"{optim}.min_lr_ratio", lr_min / lr, None)]
