"""Run a function on N CPU ranks over gloo (real processes), with megatron-core's CPU shim.

``run_ranks(fn, world, *args)`` spawns ``world`` processes, initialises a gloo process group in
each, calls ``fn(rank, world, *args)`` and returns the list of what each rank returned (rank
order). An exception on any rank fails the call with that rank's traceback. ``fn`` must be a
module-level function (it is pickled by reference)."""

from __future__ import annotations

import os
import socket
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.megatron.cpu_shim import install_on_import

RANK_TIMEOUT_S = 600  # only to catch a hang: ranks that wait on each other for this long fail


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, fn, args, results):
    import datetime

    install_on_import()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S)
        )
        results[rank] = ("ok", fn(rank, world, *args))
    except BaseException:
        results[rank] = ("error", traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, world: int, *args):
    ctx = mp.get_context("spawn")
    port = _free_port()
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [
            ctx.Process(target=_entry, args=(rank, world, port, fn, args, results)) for rank in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(RANK_TIMEOUT_S + 60)
        for p in procs:
            if p.is_alive():
                p.kill()
        out = dict(results)
    errors = [f"rank {r}:\n{v[1]}" for r, v in sorted(out.items()) if v[0] == "error"]
    missing = [r for r in range(world) if r not in out]
    if errors or missing:
        raise RuntimeError("\n".join(errors) + (f"\nranks without a result: {missing}" if missing else ""))
    return [out[r][1] for r in range(world)]
