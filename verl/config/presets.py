"""Which sizes a PPO run is composed with: verl's defaults, or the embedded default's for the built-in models.

``verl/trainer/config/ppo_trainer.yaml`` is verl's config (a 1,024-prompt batch, lr 1e-6, 8 GPUs a
node); the embedded default trains a tiny model on a CPU and needs sizes of its own, the option
``embedded`` of the Hydra group ``preset`` (``preset/embedded.yaml``). Where a PPO config is
composed by this project (:func:`verl.config.ppo_trainer.load_config`, the entry points'
:func:`verl.config.cli.prepare_argv`), the preset is chosen once, by this rule:

* the command line names one (``preset=embedded``, or ``preset=verl`` for verl's defaults): that one;
* else, when the composed ``actor_rollout_ref.model.path`` is one of the built-in tiny models
  (:data:`~verl.config.actor.BUILTIN_MODEL_PATHS`, made on first use): ``embedded``;
* else ``verl`` (sets nothing): your model gets verl's defaults, as verl would run the same line.

Plain Hydra (a verl recipe's ``@hydra.main``) composes verl's defaults; it adds ``preset=embedded``
itself when it wants the CPU sizes.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from verl.config.actor import BUILTIN_MODEL_PATHS
from verl.utils.cache import resolve_cache_path

PRESET_GROUP = "preset"
"""The Hydra group of the sizes presets (``verl/trainer/config/preset/``)."""
EMBEDDED = "embedded"
"""The embedded default's option: the CPU demo's batch sizes, learning rates, data and loop length."""
MODEL_KEY = "actor_rollout_ref.model.path"


def names_a_preset(overrides: list[str]) -> bool:
    """Whether the command line chooses the preset itself (``preset=...``, ``+preset=...``, ``~preset``)."""
    return any(arg.lstrip("+~").split("=", 1)[0] == PRESET_GROUP for arg in overrides)


def is_builtin_model_path(path: str) -> bool:
    """One of the tiny models :mod:`verl.builtin` makes (:data:`~verl.config.actor.BUILTIN_MODEL_PATHS`)."""
    return resolve_cache_path(path).resolve() in [
        resolve_cache_path(p).resolve() for p in BUILTIN_MODEL_PATHS
    ]


def with_preset(overrides: list[str], composed: DictConfig) -> list[str]:
    """``overrides`` plus ``preset=embedded`` when the rule above chooses it; ``composed`` is the
    config ``overrides`` give, the model path is read from."""
    if names_a_preset(overrides):
        return overrides
    path = OmegaConf.select(composed, MODEL_KEY, default=None)
    if isinstance(path, str) and is_builtin_model_path(path):
        return [*overrides, f"{PRESET_GROUP}={EMBEDDED}"]
    return overrides


__all__ = ["EMBEDDED", "PRESET_GROUP", "is_builtin_model_path", "names_a_preset", "with_preset"]
