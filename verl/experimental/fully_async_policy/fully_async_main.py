"""verl's fully asynchronous trainer: ``python -m verl.experimental.fully_async_policy.fully_async_main``.

The rollout runs on a pool of its own (``rollout.nnodes x rollout.n_gpus_per_node``) and generates
ahead of the actor within verl's bound: per weight sync (every ``trigger_parameter_sync_step``
updates, each on ``require_batches x ppo_mini_batch_size`` prompts) it may submit ``(1 +
staleness_threshold)`` sync windows of prompts, counting those not yet trained on; with
``partial_rollout`` a sync lands between two decoding steps of the requests in flight. As the
one-step-off entry point, this is the asynchronous trainer under a preset
(``fully_async_ppo_trainer.yaml``); verl's keys are converted as :mod:`verl.config.fully_async`
says (each conversion noted in the log). See docs/async.md.
"""

from __future__ import annotations

from functools import partial

from verl.experimental.async_entry import check_async_entry, run_async_entry

CONFIG_NAME = "fully_async_ppo_trainer"
ENTRY = "verl.experimental.fully_async_policy.fully_async_main"
check_fully_async = partial(check_async_entry, entry=ENTRY)

if __name__ == "__main__":
    run_async_entry(CONFIG_NAME, ENTRY)
