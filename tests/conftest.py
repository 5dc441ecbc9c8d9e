"""Shared fixtures: one local Ray instance per test session, GPU marker handling."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The built-in task and tiny model are cached here (created once, reused by later runs).
os.environ.setdefault("VERL_CACHE_DIR", str(REPO_ROOT / ".cache" / "verl"))
# Trainings run one after another in this process: each starts its roles in the worker processes
# the previous one left clean (tests/single_controller/test_process_reuse.py checks that this
# changes no number), which saves the start-up of Python, torch and the imports per run.
os.environ.setdefault("VERL_REUSE_WORKER_PROCESSES", "1")
# `make test` runs two pytest processes on two cores, each with its own Ray workers, so torch's
# OpenMP threads often wait for a core: spinning while they wait (the default) burns the core the
# other thread needs. Waiting asleep halved the time of the learning tests run side by side
# (174 s -> 85 s); results are unchanged. Set before torch loads here, inherited by Ray and subprocesses.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# A Ray started without an address joins the cluster that `ray start` (or ray.cluster_utils, as the
# multi-node test's) last began on this machine, while it runs: here, and in the trainer subprocesses
# that inherit this, it always starts its own (`ray_init.address` or the multi-node test's explicit
# address still win). Without it, the other xdist process's session Ray or trainer run could land on
# that 2-node test cluster ("num_cpus must not be provided", or a run on someone else's nodes).
os.environ.setdefault("RAY_ADDRESS", "local")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def ray_session():
    """Start Ray once for the whole session (2 CPUs, like CI) and stop it at the end."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_worker_niceness", "0")
        pythonpath = os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p)
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=True,
            runtime_env={
                # megatron-core on CPU: workers that import it get the test-only shim
                "worker_process_setup_hook": "tests.megatron.cpu_shim.install_on_import",
                "env_vars": {
                    "PYTHONPATH": pythonpath,
                    "TOKENIZERS_PARALLELISM": "false",
                    "VERL_CACHE_DIR": os.environ["VERL_CACHE_DIR"],
                },
            },
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def builtin_assets() -> dict[str, str]:
    """The built-in arithmetic task and tiny model (built on first use), as config paths."""
    from verl.builtin import task as builtin
    from verl.builtin.warmup import ensure_builtin_model
    from verl.utils.cache import cache_dir

    cache = cache_dir()
    paths = {
        "model": str(builtin.builtin_model_dir()),
        "train": str(cache / "data" / "arith" / "train.parquet"),
        "val": str(cache / "data" / "arith" / "test.parquet"),
    }
    builtin.ensure_builtin_data(paths["train"], paths["val"])
    ensure_builtin_model(paths["model"])
    return paths
