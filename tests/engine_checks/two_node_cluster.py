"""A two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and a second node,
each its own raylet with 1 CPU), kept apart from other clusters on the machine.

Usage: RAY_TMPDIR=<short dir> python two_node_cluster.py
Prints the cluster's address on the first line, then answers one command per stdin line with
one JSON line: ``nodes`` (the alive node ids), ``placement_groups`` (every placement group's
state), ``head`` (the head's node id, in a list), ``kill <node id>`` (that node's raylet and every process of it
killed with SIGKILL, as a lost machine: the node ids left). Shuts the cluster down when stdin closes. RAY_TMPDIR keeps its sessions and its
``ray_current_cluster`` file out of /tmp/ray, where a bare ``ray.init()`` elsewhere would find it.
"""

import json
import sys

from ray.cluster_utils import Cluster

node = {"num_cpus": 1, "object_store_memory": 128 * 1024 * 1024, "include_dashboard": False}
cluster = Cluster(initialize_head=True, head_node_args=node, shutdown_at_exit=True)
cluster.add_node(**node)
cluster.wait_for_nodes()
print(cluster.address, flush=True)
try:
    for line in sys.stdin:
        if line.strip() == "nodes":
            answer = [n["NodeID"] for n in cluster.global_state.node_table() if n["Alive"]]
        elif line.strip() == "head":
            answer = [cluster.head_node.node_id]
        elif line.startswith("kill "):
            lost = next(n for n in cluster.list_all_nodes() if n.node_id == line.split()[1])
            cluster.remove_node(lost, allow_graceful=False)
            answer = [n.node_id for n in cluster.list_all_nodes()]
        else:
            answer = [pg["state"] for pg in cluster.global_state.placement_group_table().values()]
        print(json.dumps(answer), flush=True)
finally:
    cluster.shutdown()
