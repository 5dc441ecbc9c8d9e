"""Every other key of verl's PPO config: accepted, and either converted, refused or noted.

``verl091_keys.json`` lists every leaf key of verl 0.9.1's ``ppo_trainer`` config with its default,
and ``verl_head_keys.json`` those of both generated trainer configs (FSDP and Megatron) of verl's
repository at commit b178a3c (January 2026), which adds keys 0.9.1's lacks (``router_replay``,
``data.sampler``, ``reward_manager``, the reward model's ``megatron`` section, ...); both are
recorded by ``tests/trainer/config/verl_reference/record_verl_keys.py``. Most are features this
project does not have (profilers, quantization-aware training, multi-token prediction, the
transfer queue, distillation, ...) or knobs of verl's own implementation (``fsdp_config.strategy``,
``use_torch_compile``, ...). A verl script may set any of them, so none is an unknown key here:

* on the command line, ``key=value`` (or ``+key=value``) for a key of those tables (or a section of
  them, ``turbo_config=...``) that the schema lacks becomes ``++verl_extras.<key>=value``
  (:func:`route_override`; ``++`` so that a later ``key=value`` overrides an earlier one, as for
  any other key), so the config itself records what was given, whichever entry point composed it;
* when the config is typed (:func:`check_verl_extras`) a key with a home here is converted onto it
  (:data:`EXTRA_ALIASES`; the nested LoRA section ``actor_rollout_ref.model.lora.*``, see
  :func:`convert_lora`; VeOmni's engine keys, :mod:`verl.config.veomni`) and leaves
  ``verl_extras``; every other one is listed once in the log as having no effect
  (:func:`noted_extra_keys`, read by ``inert_keys``). A converted key set both ways to different
  values is refused, naming both keys;
* a feature key set away from verl's default is refused with the reason (:data:`FEATURES`) when a
  run starts (:func:`refuse_features`, one of :mod:`verl.config.start_up`'s checks): ``--cfg job``
  prints the config.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from verl.config.base import ConfigError, check
from verl.config.keypaths import get_key, set_key, within_schema
from verl.config.rollout_backends import ROLLOUT_BACKENDS
from verl.config.veomni import Move, convert_veomni, veomni_keys

KEYS_FILE = Path(__file__).with_name("verl091_keys.json")
HEAD_KEYS_FILE = Path(__file__).with_name("verl_head_keys.json")
SECTION = "verl_extras"

# verl 0.9.1's spelling -> the key read here
EXTRA_ALIASES = {
    "ray_kwargs.ray_init.num_cpus": "ray_init.num_cpus",
    "ray_kwargs.timeline_json_file": "ray_init.timeline_json_file",
    "data.tool_config_path": "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    # verl's actor reads its own key, which defaults to the model's; one switch packs actor and reference here
    "actor_rollout_ref.actor.use_remove_padding": "actor_rollout_ref.model.use_remove_padding",
    # verl's repository: the reward manager section's name interpolates reward_model.reward_manager
    "reward_manager.name": "reward_model.reward_manager",
}

_NOT_HERE = "is not implemented here"
# a key matching one of these, set away from verl's default, asks for something this project lacks
FEATURES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(pattern), reason)
    for pattern, reason in [
        (r"(^|\.)qat(\.|$)", f"quantization-aware training {_NOT_HERE}"),
        (r"(^|\.)mtp(\.|$)", f"multi-token prediction {_NOT_HERE}"),
        (r"(^|\.)turbo_config\.", f"verl's FSDP turbo engine {_NOT_HERE}"),
        (r"(^|\.)tiled_mlp\.", f"tiled MLP {_NOT_HERE}"),
        (
            r"^critic\.model\.lora\.",
            f"LoRA for the critic {_NOT_HERE} (the policy's is: actor_rollout_ref.model.lora.*)",
        ),
        (r"\.model\.lora\.type$", "only plain LoRA (peft's) is implemented"),
        (r"\.model\.lora\.dropout$", "LoRA adapters train without dropout here"),
        (
            r"\.model\.lora\.lora_B_init_method$",
            "B starts at zero here, so training starts from the base model",
        ),
        (r"\.model\.lora\.dtype$", "the adapters are held in the model's dtype (fsdp_config.model_dtype)"),
        (r"\.model\.lora\.freeze_", "vision models are not supported"),
        (
            r"^critic\.model\.(lora_rank|lora_adapter_path)$",
            f"LoRA for the critic {_NOT_HERE} (the policy's is: actor_rollout_ref.model.lora_rank)",
        ),
        (r"(^|\.)disaggregation\.", f"prefill/decode disaggregation {_NOT_HERE}"),
        (r"^transfer_queue\.", f"the transfer queue {_NOT_HERE}"),
        (r"^trainer\.v1\.", "the options of verl's v1 trainer are not implemented (see trainer.mode=async)"),
        (r"^skip\.", f"verl's rollout-skipping cache {_NOT_HERE}"),
        (
            r"\.optim\.(optimizer|optimizer_impl)$",
            "only torch.optim.AdamW is implemented",
        ),
        (r"\.rollout\.logprobs_mode$", "the engines return processed log-probs (after temperature) only"),
        (
            r"\.rollout\.(data|expert|pipeline_model)_parallel_size$",
            "parallel inference engines are not supported yet",
        ),
        (r"\.rollout\.nnodes$", "rollout engines run on the trainer's nodes"),
        (r"\.rollout\.quantization", f"quantized rollout {_NOT_HERE}"),
        (r"\.rollout\.over_sample_rate$", f"over-sampling {_NOT_HERE}"),
        (
            r"\.rollout\.agent\.custom_async_server\.",
            "custom async servers are not supported; use rollout.name",
        ),
        (r"\.use_prefix_grouper$", f"the prefix grouper {_NOT_HERE}"),
        (
            r"^data\.mm_processor_kwargs$",
            "the image processor's own settings (the model folder's preprocessor_config.json) are used; "
            "per-image size limits go in the image column's entries (docs/vlm.md)",
        ),
        (
            r"\.router_replay\.mode$",
            f"router replay (MoE routing recorded at rollout, replayed in training) {_NOT_HERE}",
        ),
        (r"\.router_replay\.(record|replay)_file$", f"router replay {_NOT_HERE}"),
        (
            r"^data\.sampler\.",
            "the data loader's own seeded order is used; custom samplers (curriculum) are not supported",
        ),
        (r"^data\.datagen\.", f"generating data during training {_NOT_HERE}"),
        (
            r"^reward_manager\.(source|module\.path)$",
            "reward managers are looked up by name: register yours with @register_reward_manager in a module "
            "imported through actor_rollout_ref.model.external_lib, then set reward_model.reward_manager",
        ),
        (r"\.rollout\.skip_rollout$", f"verl's rollout-skipping cache {_NOT_HERE}"),
        (
            r"\.load_weight$",
            "the weights are always loaded from the model's path (dummy weights: rollout.load_format)",
        ),
        (r"^data\.audio_key$", "audio inputs are not supported"),
        (r"\.fsdp_config\.forward_only$", "set by the role (the reference only runs forward)"),
        (r"^data\.function_tool_path$", f"function tools {_NOT_HERE}; use a tool YAML"),
    ]
]


@functools.cache
def verl_keys() -> dict[str, Any]:
    """verl's leaf keys and their defaults: 0.9.1's, and those its repository's head adds."""
    return {**json.loads(HEAD_KEYS_FILE.read_text()), **json.loads(KEYS_FILE.read_text())}


@functools.cache
def verl_sections() -> frozenset[str]:
    """Every section (a proper prefix) of :func:`known_keys`: ``a.b`` for ``a.b.c``."""
    return frozenset(key.rsplit(".", i)[0] for key in known_keys() for i in range(1, key.count(".") + 1))


@functools.cache
def known_keys() -> dict[str, Any]:
    """:func:`verl_keys` and the keys verl's VeOmni engine adds (``model_engine=veomni``)."""
    return {**verl_keys(), **veomni_keys()}


def is_extra_key(key: str, schema: type) -> bool:
    """A key (or a section) of verl's that this schema does not have (nor holds inside a free-form dict)."""
    return (key in known_keys() or key in verl_sections()) and not within_schema(schema, key)


def is_default(value: Any, default: Any) -> bool:
    """``value`` is verl's default, in any of its spellings (``adamw`` for ``AdamW``, ``{}`` for null)."""
    if isinstance(value, str) and isinstance(default, str):
        return value.lower() == default.lower()
    empty = (None, {}, [])
    return value == default or (value in empty and default in empty)


_ASSIGN = re.compile(r"^(\+{0,2})([^=~+][^=]*)=(.*)$", re.DOTALL)


def route_override(arg: str, schema: type) -> str:
    """``[+]key=value`` for an extra key -> ``++verl_extras.key=value``; other arguments unchanged."""
    match = _ASSIGN.match(arg)
    if match is None or not is_extra_key(match.group(2), schema):
        return arg
    return f"++{SECTION}.{match.group(2)}={match.group(3)}"


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of the nested ``node``: a dict under a key is a section unless the key is a leaf of
    verl's (a dict value such as ``engine_kwargs``) that no version holds as a section."""
    here = prefix.rstrip(".")
    if isinstance(node, dict) and (
        not prefix or (node and (here not in known_keys() or here in verl_sections()))
    ):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def given_extra_keys(config: Any) -> dict[str, Any]:
    """The extra keys a config was given, with their values (dotted keys)."""
    return _flatten(config.verl_extras or {})


def check_verl_extras(config: Any) -> list[str]:
    """Convert the keys with a home here (a note for each; they leave ``verl_extras``); the rest stay
    and are noted as having no effect, or refused at start-up (:func:`refuse_features`)."""
    given = given_extra_keys(config)
    for key in given:
        if key not in known_keys() and key not in verl_sections():
            raise ConfigError(f"{SECTION}.{key}: not a key of verl's config; remove it")
    notes = [f"{key}={given[key]!r} -> {target}" for key, target in EXTRA_ALIASES.items() if key in given]
    for key in (key for key in EXTRA_ALIASES if key in given):
        set_key(config, EXTRA_ALIASES[key], given[key])
    engine_notes, moves, refusals = convert_veomni(config, given)
    if refusals:
        raise refusal(*refusals[0])
    moves += convert_lora(config, given)
    notes += engine_notes + [assign(config, move) for move in moves]
    merged = check_lora_merge(config, given)
    converted = [*EXTRA_ALIASES, *(move.key for move in moves if move.key in given), *merged]
    for key in converted:
        _drop(config.verl_extras, key)
    return notes + [f"{key}=True: {why}" for key, why in merged.items()]


def refuse_features(config: Any) -> None:
    """At start-up: refuse the first extra key that asks, away from verl's default, for a feature this
    project lacks (:data:`FEATURES`), naming the key, the reason and verl's default."""
    for key, value in given_extra_keys(config).items():
        default = known_keys().get(key)
        reason = next((reason for pattern, reason in FEATURES if pattern.search(key)), None)
        if reason is not None and not is_default(value, default):
            raise refusal(key, value, reason, default)


def refusal(key: str, value: Any, reason: str, default: Any) -> ConfigError:
    return ConfigError(f"{key}={value!r}: {reason}. Leave it at verl's default ({default!r}) or remove it")


def assign(config: Any, move: Move) -> str:
    """Put ``move.value`` on ``move.target``; that key set to another value than its default is
    refused, naming both keys. Returns the log note."""
    current = get_key(config, move.target)
    check(
        current in (move.value, move.default),
        move.key,
        f"the same value as {move.target}={current!r} (both spellings are set)",
        move.given,
    )
    set_key(config, move.target, move.value)
    return f"{move.key}={move.given!r} -> {move.target}={move.value!r}"


def _drop(extras: dict[str, Any], key: str) -> None:
    """Remove the dotted ``key`` from the nested ``extras``, and the sections it leaves empty."""
    head, _, rest = key.partition(".")
    if head not in extras:
        return
    if rest and isinstance(extras[head], dict):
        _drop(extras[head], rest)
    if not rest or extras[head] == {}:
        del extras[head]


def noted_extra_keys(config: Any) -> list[str]:
    """The extra keys given that have no effect here (the converted ones have left ``verl_extras``)."""
    return sorted(given_extra_keys(config))


# ---------------------------------------------------------------------------- model.lora.*
LORA = "actor_rollout_ref.model.lora"
MODEL = "actor_rollout_ref.model"
# the nested (Megatron-style) section's key -> (the flat key of this project's peft LoRA, its default)
LORA_KEYS: dict[str, tuple[str, Any]] = {
    "rank": (f"{MODEL}.lora_rank", 0),
    "alpha": (f"{MODEL}.lora_alpha", 16),
    "target_modules": (f"{MODEL}.target_modules", "all-linear"),
    "exclude_modules": (f"{MODEL}.exclude_modules", None),
    "adapter_path": (f"{MODEL}.lora_adapter_path", None),
}
SECTION_FILLED = ("alpha", "target_modules")
"""With the section's rank given, these come from the section too (verl's defaults if not given),
unless the flat key was set: verl reads the section whole when its rank turns LoRA on."""
# verl's Megatron module names -> peft's names of the same layers in Llama/Qwen-style models
MEGATRON_MODULES: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
    "linear_q": ("q_proj",),
    "linear_k": ("k_proj",),
    "linear_v": ("v_proj",),
    "linear_fc1_up": ("up_proj",),
    "linear_fc1_gate": ("gate_proj",),
}
ALL_LINEAR = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}
"""verl's default target_modules: every linear layer of a decoder layer, peft's ``all-linear``."""


def convert_lora(config: Any, given: dict[str, Any]) -> list[Move]:
    """The moves of ``model.lora.{rank, alpha, target_modules, exclude_modules, adapter_path}``
    given away from verl's default onto the flat keys (module names translated to peft's); with the
    section's rank given, its alpha and target_modules (verl's section defaults when not given)
    replace flat keys left at their defaults, as verl reads the section whole then."""
    away = {
        name: given[f"{LORA}.{name}"]
        for name in LORA_KEYS
        if f"{LORA}.{name}" in given
        and not is_default(given[f"{LORA}.{name}"], known_keys()[f"{LORA}.{name}"])
    }
    moves = [_lora_move(name, value, f"{LORA}.{name}") for name, value in away.items()]
    if "rank" not in away:
        return moves
    for name in (name for name in SECTION_FILLED if name not in away):
        key, value = f"{LORA}.{name}", given.get(f"{LORA}.{name}", known_keys()[f"{LORA}.{name}"])
        move = _lora_move(name, value, key if key in given else f"{key} (verl's default with {LORA}.rank)")
        if get_key(config, move.target) == move.default != move.value:
            moves.append(move)
    return moves


def _lora_move(name: str, value: Any, key: str) -> Move:
    target, default = LORA_KEYS[name]
    return Move(key, value, target, peft_modules(key, value) if name.endswith("_modules") else value, default)


def peft_modules(key: str, value: Any) -> Any:
    """Module names as peft reads them: verl's Megatron names become the Llama/Qwen layer names they
    stand for (all four fused groups: ``all-linear``); other names and strings are kept."""
    if isinstance(value, str) or value is None:
        return value
    names = list(value)
    if set(names) == ALL_LINEAR:
        return "all-linear"
    check(
        not any("*" in name or "." in name for name in names),
        key,
        "module names (Megatron's linear_qkv, linear_proj, linear_fc1, linear_fc2, ... or peft's q_proj, "
        "...): patterns over Megatron's module paths have no peft counterpart",
        value,
    )
    out: list[str] = []
    for name in names:
        out += [n for n in MEGATRON_MODULES.get(name, (name,)) if n not in out]
    return out


def check_lora_merge(config: Any, given: dict[str, Any]) -> dict[str, str]:
    """``model.lora.merge=True`` with LoRA on: accepted where the rollout receives merged weights
    (returns ``{key: why}``), refused where it receives the adapter alone (an engine that serves
    adapters on base weights it loaded itself, as ``syncs_lora_adapter`` in
    ``verl/workers/rollout/engine_rollout.py`` decides). With LoRA off it is inert."""
    key = f"{LORA}.merge"
    model, rollout = get_key(config, MODEL), config.actor_rollout_ref.rollout
    if given.get(key) is not True or not (model.lora_rank > 0 or model.lora_adapter_path):
        return {}
    backend = ROLLOUT_BACKENDS.get(rollout.name)
    adapter_alone = (
        backend is not None and backend.serves_lora_adapters and not rollout.load_format.startswith("dummy")
    )
    where = f"rollout.name={rollout.name}, rollout.load_format={rollout.load_format}"
    check(
        not adapter_alone,
        key,
        f"False with {where}: the engine receives the LoRA adapter alone (set "
        "actor_rollout_ref.rollout.load_format=dummy to send it the merged weights instead)",
        True,
    )
    return {key: f"the rollout receives the merged weights with {where}"}
