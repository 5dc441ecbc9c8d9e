"""verl's config location: the Hydra presets (``ppo_trainer.yaml``), found as ``pkg://verl.trainer.config``.

The schema (the dataclasses every key is checked against) is :mod:`verl.config`.
"""
