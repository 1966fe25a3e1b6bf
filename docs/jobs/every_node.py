"""A Ray job that runs one task on every alive node and says where it ran.

    ray job submit --address http://127.0.0.1:8265 --working-dir docs/jobs -- python every_node.py

Each task is pinned to its node (NodeAffinitySchedulingStrategy, soft=False) and
reports the node's hostname, its Ray node IP and the numpy version there
("numpy not installed" where ray_pip_packages did not bring it).
"""

import socket

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
def where():
    try:
        import numpy
    except ImportError:
        numpy_text = "numpy not installed"
    else:
        # Use numpy for real: a small matrix product on the node.
        product = int(numpy.arange(4).reshape(2, 2).dot(numpy.ones(2, dtype=int)).sum())
        numpy_text = "numpy %s (check %d)" % (numpy.__version__, product)
    return socket.gethostname(), ray.util.get_node_ip_address(), numpy_text


ray.init()
nodes = [n for n in ray.nodes() if n["Alive"]]
tasks = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
         for n in nodes]
for hostname, ip, numpy_text in sorted(ray.get(tasks)):
    print("ran on %s (%s): %s" % (hostname, ip, numpy_text))
print("%d alive nodes, %d tasks ran" % (len(nodes), len(tasks)))
