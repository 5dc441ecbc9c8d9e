"""Cost of a DP_COMPUTE_PROTO call against bare Ray actor calls moving the same data.

    .venv/bin/python benchmarks/dispatch_overhead.py [--repeats 20]

Both sides use two actor processes on a local Ray. The framework call chunks a DataProto
over 2 ranks, each rank returns a DataProto of the same size, and the driver concatenates;
the baseline splits a plain tensor over two bare actors, each returns a tensor of the same
size, and the driver concatenates. Prints median seconds and the ratio (aim <= 1.3x).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch

from verl.protocol import DataProto
from verl.single_controller import Dispatch, Worker, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup


class ScaleWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data.batch["x"] * 2})


@ray.remote(num_cpus=0.5)
class BareActor:
    def scale(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False)
    pool = RayResourcePool([2], use_gpu=False, cpus_per_process=0.5)
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ScaleWorker), role="bench")
    bare = [BareActor.remote() for _ in range(2)]
    print(f"{'size':>6} {'framework_s':>12} {'bare_ray_s':>11} {'ratio':>6}")
    for megabytes in (1, 64):
        x = torch.randn(megabytes * 2**20 // 4 // 256, 256)
        data = DataProto.from_dict({"x": x})

        def framework(data: DataProto = data, x: torch.Tensor = x) -> None:
            out = wg.scale(data)
            assert out.batch["y"].shape == x.shape

        def baseline(x: torch.Tensor = x) -> None:
            halves = x.chunk(2)
            out = torch.cat(ray.get([a.scale.remote(h) for a, h in zip(bare, halves)]))
            assert out.shape == x.shape

        fw, base = median_seconds(framework, args.repeats), median_seconds(baseline, args.repeats)
        print(f"{megabytes:>4}MB {fw:>12.4f} {base:>11.4f} {fw / base:>6.2f}")
    wg.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
