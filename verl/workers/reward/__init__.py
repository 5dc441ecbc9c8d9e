"""The reward managers' earlier home; they are :mod:`verl.workers.reward_manager` now (verl's path).

Only :mod:`verl.workers.reward.loader` is kept, for importers not yet moved; import from
``verl.workers.reward_manager`` (or ``verl.trainer.ppo.reward``) instead.
"""
