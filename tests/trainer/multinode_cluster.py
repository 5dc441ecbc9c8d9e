"""A real 2-node Ray cluster on this machine (two raylets on loopback, 1 CPU each), for the
multi-node test: ``python tests/trainer/multinode_cluster.py`` prints the address, waits for a
line on stdin, then stops exactly the processes it started (never ``ray stop``, which would end
every Ray on the machine)."""

from __future__ import annotations

import sys

from ray.cluster_utils import Cluster


def main() -> None:
    node = {"num_cpus": 1, "object_store_memory": 256 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "resources": {"head_node": 1}})
    worker = cluster.add_node(**node, resources={"worker_node": 1})
    cluster.wait_for_nodes()
    print(f"ADDRESS {cluster.address}", flush=True)
    print(f"WORKER_NODE {worker.node_id}", flush=True)
    command = sys.stdin.readline().strip()
    if command == "kill-worker":  # node loss: the worker raylet goes away, the head stays
        cluster.remove_node(worker, allow_graceful=False)
        print("WORKER_REMOVED", flush=True)
        sys.stdin.readline()
    cluster.shutdown()


if __name__ == "__main__":
    main()
