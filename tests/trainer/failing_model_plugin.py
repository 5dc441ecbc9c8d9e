"""A plugin whose import fails inside the worker processes only, as a broken model plugin would:
loaded through ``actor_rollout_ref.model.external_lib=tests.trainer.failing_model_plugin``.

The driver imports it too (the config checks ``external_lib``); there it does nothing. Worker
processes carry ``RANK`` in their environment (set by their Ray host actor)."""

from __future__ import annotations

import os

if "RANK" in os.environ:
    raise RuntimeError(
        "failing_model_plugin: the model plugin fails on purpose while the worker loads the model"
    )
