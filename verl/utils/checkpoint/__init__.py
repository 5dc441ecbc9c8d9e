"""Checkpoint managers and the latest-checkpoint lookup, at verl's paths
(:mod:`~verl.utils.checkpoint.checkpoint_manager`, :mod:`~verl.utils.checkpoint.fsdp_checkpoint_manager`);
the sharded folder format they share with the training engine is :mod:`~verl.utils.checkpoint.sharded`."""
