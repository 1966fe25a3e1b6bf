#!/usr/bin/env python3
"""What ray_tls costs, in one run: Ray's task throughput and object transfer without and with TLS.

On a deployed lab (any prefix; its inventory given with -i), one after another:

  plain    site.yml without ray_tls (not timed), every node's Ray restarted, then the workload
  tls      site.yml -e ray_tls=true (not timed), every node's Ray restarted, then the workload
  plain    site.yml again (the lab is left as it was), every node's Ray restarted, then the workload again

The workload is a driver on the head (Ray's venv, the node's ray.env, so the TLS settings when they are on):
``--tasks`` empty tasks pinned to worker1 (tasks per second, the driver's submission and the round trips over the
fabric), and ``--rounds`` objects of ``--mib`` MiB made on worker1 and fetched by the driver on the head (MiB/s over
the fabric). Each phase's figure is the best of ``--repeat`` runs; the ratios TLS / plain are printed against the
mean of the two plain phases. The lab's fabric is a veth pair between containers on one 2-core machine, so the
ratios say what TLS costs in CPU per byte and per call here, not what an InfiniBand fabric would show.

Usage (from the repository root, with nothing else running on the machine):
    .venv/bin/python bench/tls/run.py -i lab/.labs/<prefix>/inventory
Only the lab's own containers are contacted.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, ".venv", "bin")
RAY_ENV = "set -a; . /etc/ray/ray.env; set +a"

WORKLOAD = r'''
import json, sys, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
tasks, rounds, mib = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
node = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == sys.argv[2]][0]
on_worker = NodeAffinitySchedulingStrategy(node, soft=False)

@ray.remote(num_cpus=0)
def empty():
    return None

@ray.remote(num_cpus=0)
def blob(size):
    return b"x" * size

ray.get([empty.options(scheduling_strategy=on_worker).remote() for _ in range(20)])  # workers started
start = time.perf_counter()
ray.get([empty.options(scheduling_strategy=on_worker).remote() for _ in range(tasks)])
task_s = time.perf_counter() - start
ray.get(blob.options(scheduling_strategy=on_worker).remote(1024))
start = time.perf_counter()
for _ in range(rounds):
    assert len(ray.get(blob.options(scheduling_strategy=on_worker).remote(mib * 1048576))) == mib * 1048576
object_s = time.perf_counter() - start
print("RESULT " + json.dumps({"tasks_per_s": tasks / task_s, "mib_per_s": rounds * mib / object_s}))
'''


def hosts_of(inventory):
    out = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", inventory, "--list"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    hostvars = data["_meta"]["hostvars"]
    head = data["ray_head"]["hosts"][0]
    workers = sorted(data["ray_worker"]["hosts"])
    return head, workers, hostvars


def deploy(inventory, *extra):
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "site.yml", "-i", inventory, *extra], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit("site.yml %s failed (%d):\n%s" % (" ".join(extra), proc.returncode, proc.stdout[-3000:]))


def restart(hosts, head, head_ip):
    """Every node's Ray restarted and ALIVE again: each phase measures a fresh cluster (a cluster that ran for
    hours, with the GCS full of finished jobs and dead actors, schedules slower)."""
    for name in [head] + [h for h in hosts if h != head]:
        unit = "ray-head" if name == head else "ray-worker"
        subprocess.run(["docker", "exec", name, "systemctl", "restart", unit], check=True, capture_output=True)
    probe = ("curl -s -m 5 -H \"Authorization: Bearer $(cat /etc/ray/auth_token)\" "
             "'http://%s:8265/api/v0/nodes?detail=true'" % head_ip)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        out = subprocess.run(["docker", "exec", head, "bash", "-c", probe], capture_output=True, text=True).stdout
        try:
            alive = [n for n in json.loads(out)["data"]["result"]["result"] if n["state"] == "ALIVE"]
        except (ValueError, KeyError, TypeError):
            alive = []
        if len(alive) == len(hosts):
            return
        time.sleep(2)
    sys.exit("the cluster did not come back after the restart within 300 s")


def workload(head, head_ip, worker_ip, args):
    script = "cat > /var/tmp/raymetal-tls-bench.py <<'EOF'\n%s\nEOF\n%s; cd /var/tmp && " \
             "timeout 600 /opt/ray/venv/bin/python raymetal-tls-bench.py %s:6379 %s %d %d %d" % (
                 WORKLOAD, RAY_ENV, head_ip, worker_ip, args.tasks, args.rounds, args.mib)
    proc = subprocess.run(["docker", "exec", head, "bash", "-c", script], capture_output=True, text=True,
                          check=False, timeout=700)
    if "RESULT " not in proc.stdout:
        sys.exit("the workload failed on %s:\n%s" % (head, (proc.stdout + proc.stderr)[-3000:]))
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def best(runs):
    return {key: max(run[key] for run in runs) for key in runs[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("-i", "--inventory", default=os.path.join(ROOT, "inventory", "lab"))
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    head, workers, hostvars = hosts_of(args.inventory)
    worker = workers[0]
    head_ip, worker_ip = hostvars[head]["lab_fabric_ip"], hostvars[worker]["lab_fabric_ip"]
    phases = []
    for name, extra in (("plain", ()), ("tls", ("-e", "ray_tls=true")), ("plain", ())):
        deploy(args.inventory, *extra)
        restart([head] + workers, head, head_ip)
        figures = best([workload(head, head_ip, worker_ip, args) for _ in range(args.repeat)])
        phases.append((name, figures))
        print("%-6s %8.0f tasks/s  %8.1f MiB/s  (best of %d)" % (name, figures["tasks_per_s"], figures["mib_per_s"],
                                                                args.repeat), flush=True)
    plain = {key: (phases[0][1][key] + phases[2][1][key]) / 2 for key in phases[0][1]}
    tls = phases[1][1]
    print("\nray_tls on %s -> %s (%d empty tasks, %d x %d MiB objects):" % (head, worker, args.tasks, args.rounds,
                                                                           args.mib))
    print("  task throughput  TLS / plain = %.2f" % (tls["tasks_per_s"] / plain["tasks_per_s"]))
    print("  object transfer  TLS / plain = %.2f" % (tls["mib_per_s"] / plain["mib_per_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
