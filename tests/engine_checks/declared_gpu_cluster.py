"""A one-node Ray cluster on this machine that declares GPUs it does not have (``ray.cluster_utils.Cluster``
with ``num_gpus``): Ray's resources then look as on a GPU node, which is all rlhf's placement reads, so a
CPU test sees what a run on that many GPUs would ask for and wait for.

Usage: RAY_TMPDIR=<short dir> python declared_gpu_cluster.py GPUS
Prints the cluster's address on the first line, then answers one command per stdin line with one JSON
line: ``hold N`` places a placement group of N ``{"GPU": 1}`` bundles (as another job on the cluster
would) and answers once it is placed; ``release`` removes what ``hold`` placed. Shuts the cluster down
when stdin closes.
"""

import json
import sys

import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, remove_placement_group

node = {"num_cpus": 2, "num_gpus": int(sys.argv[1]), "object_store_memory": 128 * 1024 * 1024, "include_dashboard": False}
cluster = Cluster(initialize_head=True, head_node_args=node, shutdown_at_exit=True)
ray.init(address=cluster.address, log_to_driver=False)
print(cluster.address, flush=True)
held = []
try:
    for line in sys.stdin:
        command, *args = line.split()
        if command == "hold":
            held.append(placement_group([{"GPU": 1}] * int(args[0])))
            ray.get(held[-1].ready(), timeout=60)
        else:
            while held:
                remove_placement_group(held.pop())
        print(json.dumps(ray.available_resources().get("GPU", 0)), flush=True)
finally:
    ray.shutdown()
    cluster.shutdown()
