"""The one config schema: a dataclass per section, each key documented and validated.

Workers, algorithms and the trainer all read their settings from here; this package imports
none of them (only the algorithm registries, to check names). The Hydra presets live in
``verl/trainer/config/`` (verl's location).
"""
