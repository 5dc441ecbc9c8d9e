"""Start-up notes about the config: keys without effect here, preset values left in place."""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from verl.config.compat import MICRO_BATCH_KEYS, REWARD_ALIASES
from verl.config.inert import inert_keys
from verl.config.ppo_trainer import CONFIG_DIR, PPOTrainerConfig
from verl.config.presets import EMBEDDED, PRESET_GROUP

logger = logging.getLogger(__name__)


def preset_keys(preset: str = EMBEDDED) -> list[str]:
    """Dotted keys that a sizes preset (``verl/trainer/config/preset/<preset>.yaml``) sets."""
    raw = yaml.safe_load((Path(CONFIG_DIR) / PRESET_GROUP / f"{preset}.yaml").read_text())

    def walk(node: dict, prefix: str) -> list[str]:
        keys = []
        for key, value in node.items():
            if isinstance(value, dict):
                keys += walk(value, f"{prefix}{key}.")
            else:
                keys.append(f"{prefix}{key}")
        return keys

    return walk({k: v for k, v in raw.items() if k not in ("defaults", "hydra")}, "")


def log_config_notes(
    config: PPOTrainerConfig, device: str, overrides: list[str], builtin_model: bool = False
) -> list[str]:
    """Log (once, at start-up) what a user should know about this config; returns the notes.

    ``builtin_model``: the model is one of the built-in tiny ones (``verl.builtin.assets.is_builtin_model``),
    for which the embedded preset's sizes are meant; with another model and ``preset=embedded`` among
    ``overrides``, the sizes it still takes from that preset are listed."""
    notes = []
    inert = inert_keys(config, device, overrides)
    if inert:
        backend = f"rollout.name={config.actor_rollout_ref.rollout.name} on {device}"
        notes.append(f"these keys have no effect with {backend}: {', '.join(inert)}")
    if not builtin_model and f"{PRESET_GROUP}={EMBEDDED}" in [o.lstrip("+") for o in overrides]:
        given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        given |= {
            target for alias, target in {**MICRO_BATCH_KEYS, **REWARD_ALIASES}.items() if alias in given
        }
        if "critic.ppo_micro_batch_size" in given:  # also sets the value forward's, as in verl
            given.add("critic.forward_micro_batch_size_per_gpu")
        kept = [
            k
            for k in preset_keys()
            if k not in given and not k.startswith(("data.train_files", "data.val_files"))
        ]
        if kept:
            notes.append(
                "your model is not the built-in one, but these values still come from preset=embedded "
                f"(sized for a tiny model): {', '.join(kept)}; set them explicitly"
            )
    for note in notes:
        logger.warning("config note: %s", note)
    return notes
