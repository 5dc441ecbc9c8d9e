"""The algorithm math: advantage estimators, policy losses, KL, loss aggregation, rollout correction.

Pure functions over tensors, shared by the trainer (advantages, in-reward KL) and the workers
(actor and critic losses). verl's import path for all of it is :mod:`verl.trainer.ppo.core_algos`.
"""
