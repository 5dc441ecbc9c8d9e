"""The megatron-core CPU shim for the workers of a test's training run, as a model plugin.

The megatron trainer tests pass this module as ``model.external_lib`` (:data:`OVERRIDES`): every
worker imports it before it builds a model, so each worker process has the shim whether or not Ray's
``worker_process_setup_hook`` (tests/conftest.py) ran in it. A run in the full suite once started its
Megatron engine in a worker process without the shim (``needs a CUDA GPU`` at init_model) after
earlier modules' runs; a plugin import does not depend on how or when Ray started the process. The
schema also imports a plugin in the driver to check it: there, in the test process, it does nothing,
so the tests that expect the product to refuse megatron without a GPU still see torch unpatched. A
process that imported a plugin is not reused by later runs (``VERL_REUSE_WORKER_PROCESSES``)."""

from __future__ import annotations

import ray

from tests.megatron.cpu_shim import install_on_import

OVERRIDES = [
    f"actor_rollout_ref.model.external_lib={__name__}",
    f"critic.model.external_lib={__name__}",
]

MEGATRON_CORE_ON_CPU = True
"""Read by the product's start-up check (``verl.trainer.preflight.CPU_SHIM_ATTRIBUTE``): a run that names
this plugin is not refused for Megatron on a machine without CUDA, since its workers get the shim."""

if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
    install_on_import()
