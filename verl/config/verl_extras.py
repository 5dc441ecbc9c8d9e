"""Every other key of verl 0.9.1's PPO config: accepted, and either converted, refused or noted.

``verl091_keys.json`` lists every leaf key of verl 0.9.1's ``ppo_trainer`` config with its default
(recorded by ``tests/trainer/config/verl_reference/record_verl_keys.py``). Most are features this
project does not have (profilers, quantization-aware training, multi-token prediction, the
transfer queue, distillation, ...) or knobs of verl's own implementation (``fsdp_config.strategy``,
``use_torch_compile``, ...). A verl script may set any of them, so none is an unknown key here:

* on the command line, ``key=value`` (or ``+key=value``) for a key of that table that the schema
  lacks becomes ``+verl_extras.<key>=value`` (:func:`route_override`), so the config itself records
  what was given, whichever entry point composed it;
* at start-up (:func:`check_verl_extras`) a key with a home here is converted onto it
  (:data:`EXTRA_ALIASES`), a feature key set away from verl's default is refused with the reason
  (:data:`FEATURES`), and every other one is listed once in the log as having no effect
  (:func:`given_extra_keys`, read by ``inert_keys``).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from verl.config.base import ConfigError
from verl.config.keypaths import set_key, within_schema

KEYS_FILE = Path(__file__).with_name("verl091_keys.json")
SECTION = "verl_extras"

# verl 0.9.1's spelling -> the key read here
EXTRA_ALIASES = {
    "ray_kwargs.ray_init.num_cpus": "ray_init.num_cpus",
    "ray_kwargs.timeline_json_file": "ray_init.timeline_json_file",
    "data.tool_config_path": "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    # verl's actor reads its own key, which defaults to the model's; one switch packs actor and reference here
    "actor_rollout_ref.actor.use_remove_padding": "actor_rollout_ref.model.use_remove_padding",
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
            r"\.lora\.",
            "the Megatron-style LoRA section (model.lora.*) is not supported; use model.lora_rank, lora_alpha, target_modules",
        ),
        (
            r"^critic\.model\.(lora_rank|lora_adapter_path)$",
            f"LoRA for the critic {_NOT_HERE} (the policy's is: actor_rollout_ref.model.lora_rank)",
        ),
        (r"(^|\.)disaggregation\.", f"prefill/decode disaggregation {_NOT_HERE}"),
        (r"^transfer_queue\.", f"the transfer queue {_NOT_HERE}"),
        (r"^trainer\.v1\.", "the options of verl's v1 trainer are not implemented (see trainer.mode=async)"),
        (r"^skip\.", f"verl's rollout-skipping cache {_NOT_HERE}"),
        (
            r"\.optim\.(optimizer|optimizer_impl|override_optimizer_config)$",
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
        (r"\.freeze_vision_tower$", "vision models are not supported"),
        (r"^data\.(image_patch_size|audio_key|mm_processor_kwargs)$", "multi-modal data is not supported"),
        (r"\.fsdp_config\.forward_only$", "set by the role (the reference only runs forward)"),
        (r"^data\.function_tool_path$", f"function tools {_NOT_HERE}; use a tool YAML"),
    ]
]


@functools.cache
def verl_keys() -> dict[str, Any]:
    """verl 0.9.1's leaf keys and their defaults."""
    return json.loads(KEYS_FILE.read_text())


def is_extra_key(key: str, schema: type) -> bool:
    """A key of verl 0.9.1 that this schema does not have (nor holds inside a free-form dict)."""

    return key in verl_keys() and not within_schema(schema, key)


_ASSIGN = re.compile(r"^(\+{0,2})([^=~+][^=]*)=(.*)$", re.DOTALL)


def route_override(arg: str, schema: type) -> str:
    """``[+]key=value`` for an extra key -> ``+verl_extras.key=value``; other arguments unchanged."""
    match = _ASSIGN.match(arg)
    if match is None or not is_extra_key(match.group(2), schema):
        return arg
    return f"+{SECTION}.{match.group(2)}={match.group(3)}"


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and (not prefix or (node and prefix.rstrip(".") not in verl_keys())):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def given_extra_keys(config: Any) -> dict[str, Any]:
    """The extra keys a config was given, with their values (dotted keys)."""
    return _flatten(config.verl_extras or {})


def check_verl_extras(config: Any) -> list[str]:
    """Convert the aliases onto their keys (returns a note for each), refuse a feature key set away
    from verl's default; the rest stay in ``verl_extras`` and are noted as having no effect."""

    notes = []
    for key, value in given_extra_keys(config).items():
        if key not in verl_keys():
            raise ConfigError(f"{SECTION}.{key}: not a key of verl 0.9.1's config; remove it")
        if key in EXTRA_ALIASES:
            set_key(config, EXTRA_ALIASES[key], value)
            notes.append(f"{key}={value!r} -> {EXTRA_ALIASES[key]}")
            continue
        default = verl_keys()[key]
        for pattern, reason in FEATURES:
            if pattern.search(key) and value != default:
                raise ConfigError(
                    f"{key}={value!r}: {reason}. Leave it at verl's default ({default!r}) or remove it"
                )
    return notes


def noted_extra_keys(config: Any) -> list[str]:
    """The extra keys given that have no effect here (everything but the converted aliases)."""
    return sorted(k for k in given_extra_keys(config) if k not in EXTRA_ALIASES)
