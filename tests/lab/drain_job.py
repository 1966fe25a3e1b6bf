"""Driver for tests/lab/test_drain.py, run on the head: an actor pinned to the drained worker holds it
busy until a release file appears there, while SPREAD tasks record where (and when) each ran.

argv: gcs_address target_ip release_file log_file

The log's lines are JSON: {"ready": t} once the actor holds the node, {"draining": t} the first round after the
GCS lists the target among its draining nodes (the drain was accepted: that is the moment the test judges the
scheduler by, not when the playbook began asking, which includes starting Ray's CLI on a loaded head), one
{"ip", "t"} per task, and {"released", "end"} last.
"""

import json
import os
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

gcs, target_ip, release, log = sys.argv[1:5]
ray.init(address=gcs, logging_level="ERROR")
target = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == target_ip)


@ray.remote(num_cpus=0)
class Holder:
    def ip(self):
        return ray.util.get_node_ip_address()

    def hold(self):
        while not os.path.exists(release):
            time.sleep(0.2)
        return ray.util.get_node_ip_address()


@ray.remote(num_cpus=0.25)
def where():
    started = time.time()
    time.sleep(0.3)
    return ray.util.get_node_ip_address(), started


holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(target, soft=False)).remote()
assert ray.get(holder.ip.remote()) == target_ip
held = holder.hold.remote()
with open(log, "w") as out:
    out.write(json.dumps({"ready": time.time()}) + "\n")
    out.flush()
    rounds_after = 3
    draining = False
    while rounds_after > 0:
        if not draining and target in ray._private.state.state.get_draining_nodes():
            draining = True
            out.write(json.dumps({"draining": time.time()}) + "\n")
        done, _ = ray.wait([held], timeout=0)
        if done:
            rounds_after -= 1
        for ip, started in ray.get([where.options(scheduling_strategy="SPREAD").remote() for _ in range(6)]):
            out.write(json.dumps({"ip": ip, "t": started}) + "\n")
        out.flush()
        time.sleep(0.3)
    out.write(json.dumps({"released": ray.get(held), "end": time.time()}) + "\n")
