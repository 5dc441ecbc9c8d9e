"""verl's one-step-off policy trainer: ``python -m verl.experimental.one_step_off_policy.main_ppo``.

The rollout runs on a pool of its own (``rollout.nnodes x rollout.n_gpus_per_node`` beside the
trainer's ``trainer.nnodes x trainer.n_gpus_per_node``) and generates batch s+1 while the actor trains
on batch s, so every batch after the first is one policy version old. This is not a trainer of its
own: the preset ``one_step_off_ppo_trainer.yaml`` configures the asynchronous one (``trainer.mode=async``,
``async_training.max_staleness=1``, ``partial_rollout=False``, the rollout's log-probs as the old
policy's), and everything else (estimators, losses, rewards, checkpoints, validation) is the
synchronous trainer's. verl's one-step-off scripts run unchanged; see docs/async.md.
"""

from __future__ import annotations

from functools import partial

from verl.experimental.async_entry import check_async_entry, run_async_entry

CONFIG_NAME = "one_step_off_ppo_trainer"
ENTRY = "verl.experimental.one_step_off_policy.main_ppo"
check_one_step_off = partial(check_async_entry, entry=ENTRY)

if __name__ == "__main__":
    run_async_entry(CONFIG_NAME, ENTRY)
