#!/usr/bin/env python3
"""Day-2 figures on a lab of its own, in one run: failures, head restarts with and without GCS fault
tolerance, and an upgrade between two Ray releases.

A fresh 3-node lab (LAB_PREFIX=raybench-ops, subnets 10.231.225.0/24 and 10.231.235.0/24 by default) is
deployed with site.yml (not timed), then, one after another:

  raylet kill      kill -9 of worker1's raylet: seconds until worker1 is an ALIVE node again
  GCS kill         kill -9 of the head's gcs_server, fault tolerance off: seconds until every node is ALIVE,
                   and how many workers' units restarted (Ray's documented behaviour: all of them)
  head restart     systemctl restart ray-head, fault tolerance off: the same two figures
  FT head restart  site.yml with ray_gcs_fault_tolerance=rocksdb (not timed), a detached actor on worker1,
                   then systemctl restart ray-head: seconds until the actor answers again, workers restarted
  FT GCS kill      the same after kill -9 of gcs_server
  upgrade          playbooks/upgrade.yml to the older release in lab/lab.sh's second wheelhouse, then back to
                   the lab's release with a job running: the downtime the playbook prints (stop to every
                   node alive) for LAB_OLD_RAY_VERSION -> 2.60.0

Targets (issue 14, on the 3-node lab): GCS kill -> every worker back within 60 s; with fault tolerance a
head restart restarts no worker; upgrade downtime 30 s or less. Each is printed MET or MISSED.

Usage (from the repository root, with nothing else running on the machine):
    .venv/bin/python bench/operations/run.py
Exits 0 when every phase ran (MET or MISSED is printed), 1 on an error, 130 when interrupted.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy"))

from run import BIN, REPO, BenchError, Lab  # noqa: E402  (bench/deploy/run.py, the bench lab)

NEW = "2.60.0"
OLD = os.environ.get("LAB_OLD_RAY_VERSION", "2.59.0")
CACHE = os.environ.get("RAYMETAL_CACHE") or os.path.expanduser("~/.cache/raymetal")
TOKEN_ENV = "set -a; . /etc/ray/ray.env; set +a"
# A detached actor pinned to a node (created once), asked for its count; prints COUNTER [n, pid].
COUNTER = r'''
import json, os, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], namespace="raymetal-bench", logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0, max_restarts=0)
class Counter:
    def __init__(self):
        self.n = 0
    def add(self):
        self.n += 1
        return self.n, os.getpid()

if sys.argv[2:3] == ["create"]:
    node = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == sys.argv[3]][0]
    Counter.options(name="counter", lifetime="detached",
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
print("COUNTER " + json.dumps(ray.get(ray.get_actor("counter").add.remote(), timeout=20)))
'''


def sh(name, script, check=True, timeout=120):
    proc = subprocess.run(["docker", "exec", name, "bash", "-c", script], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise BenchError("%s: %r exited %d: %s" % (name, script, proc.returncode, proc.stderr[-2000:]))
    return proc


class Cluster:
    """The bench lab's Ray cluster, seen from its head."""

    def __init__(self, lab):
        self.lab = lab
        self.head, self.head_ip = lab.head
        self.nodes = [lab.head] + lab.workers

    def alive(self):
        """{fabric IP: node ID} of the ALIVE nodes ({} while the head's API does not answer)."""
        out = sh(self.head, "curl -s -m 5 -H \"Authorization: Bearer $(cat /etc/ray/auth_token)\" "
                            "http://%s:8265/api/v0/nodes?detail=true" % self.head_ip, check=False).stdout
        try:
            nodes = json.loads(out)["data"]["result"]["result"]
        except (ValueError, KeyError, TypeError):
            return {}
        return {n["node_ip"]: n["node_id"] for n in nodes if n["state"] == "ALIVE"}

    def units(self):
        return {name: sh(name, "systemctl show -p InvocationID --value ray-%s" % ("head" if name == self.head
                                                                                  else "worker")).stdout.strip()
                for name, _ in self.nodes}

    def wait(self, predicate, timeout, what):
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if predicate():
                return time.monotonic() - start
            time.sleep(0.5)
        raise BenchError("timed out after %d s waiting for %s" % (timeout, what))

    def all_alive(self):
        return len(self.alive()) == len(self.nodes)

    def counter(self, *args):
        proc = sh(self.head, "%s; cd /tmp && timeout 40 /opt/ray/venv/bin/python /tmp/bench_counter.py %s:6379 %s"
                  % (TOKEN_ENV, self.head_ip, " ".join(args)), check=False, timeout=60)
        return json.loads(proc.stdout.split("COUNTER ", 1)[1]) if "COUNTER " in proc.stdout else None


def playbook(lab, playbook_path, *args):
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", lab.inventory_dir, playbook_path, *args]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    with open(lab.logfile, "a", encoding="utf-8") as fh:
        fh.write("$ %s\n%s%s\n" % (" ".join(cmd), proc.stdout, proc.stderr))
    if proc.returncode != 0:
        raise BenchError("%s failed (rc=%d):\n%s" % (" ".join(cmd[3:]), proc.returncode, proc.stdout[-3000:]))
    return proc.stdout


def disrupt(cluster, name, command, done, what):
    """Run command on a node; (seconds until done(), workers whose unit restarted)."""
    workers = [n for n, _ in cluster.lab.workers]
    before = cluster.units()
    sh(name, command)
    took = cluster.wait(done, 300, what)
    after = cluster.units()
    return took, sum(1 for w in workers if after[w] != before[w])


def measure(cluster, lab):
    head = cluster.head
    worker1, worker1_ip = lab.workers[0]
    rows = []
    cluster.wait(cluster.all_alive, 240, "every node alive after the deploy")

    old_id = cluster.alive()[worker1_ip]
    took, _ = disrupt(cluster, worker1, "kill -9 $(pgrep -x raylet)",
                      lambda: cluster.alive().get(worker1_ip) not in (None, old_id), "worker1 back")
    rows.append(("raylet kill -9 -> worker1 ALIVE again", took, None, None))

    for label, command in (("GCS kill -9, no FT", "kill -9 $(pgrep -x gcs_server)"),
                           ("head restart, no FT", "systemctl restart --no-block ray-head")):
        ids = cluster.alive()
        took, restarted = disrupt(cluster, head, command,
                                  lambda: len(cluster.alive()) == len(cluster.nodes)
                                  and not set(cluster.alive().values()) & set(ids.values()), "every node back")
        target = (took <= 60, "<= 60 s") if label.startswith("GCS") else None
        rows.append((label + " -> every node ALIVE", took, restarted, target))

    playbook(lab, "site.yml", "-e", "ray_gcs_fault_tolerance=rocksdb")
    cluster.wait(cluster.all_alive, 240, "every node alive with fault tolerance on")
    sh(head, "cat > /tmp/bench_counter.py <<'EOF'\n%s\nEOF" % COUNTER)
    if cluster.counter("create", worker1_ip) is None:
        raise BenchError("the detached actor could not be created on worker1")
    for label, command in (("FT head restart", "systemctl restart --no-block ray-head"),
                           ("FT GCS kill -9", "kill -9 $(pgrep -x gcs_server)")):
        took, restarted = disrupt(cluster, head, command + "; sleep 2", lambda: cluster.counter() is not None,
                                  "the detached actor answers again")
        rows.append((label + " -> detached actor answers", took, restarted, (restarted == 0, "0 workers restarted")))
    playbook(lab, "site.yml")

    wheelhouse = os.path.join(CACHE, "wheelhouse-ray-%s" % OLD)
    if not os.path.isdir(wheelhouse):
        raise BenchError("%s is missing: run `bash lab/lab.sh wheelhouse` first" % wheelhouse)
    for version, extra in ((OLD, ["-e", "ray_wheelhouse_src=" + wheelhouse]), (NEW, [])):
        out = playbook(lab, "playbooks/upgrade.yml", "-e", "ray_version=" + version, "-e", "upgrade_confirm=yes",
                       *extra)
        match = re.search(r"Downtime: ([0-9.]+) s", " ".join(out.split()))
        if not match:
            raise BenchError("upgrade.yml printed no downtime")
        label = "upgrade %s -> %s downtime" % (NEW if version == OLD else OLD, version)
        took = float(match.group(1))
        rows.append((label, took, None, (took <= 30, "<= 30 s") if version == NEW else None))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default="raybench-ops")
    parser.add_argument("--mgmt-subnet", default="10.231.225.0/24")
    parser.add_argument("--fabric-subnet", default="10.231.235.0/24")
    args = parser.parse_args()
    args.workers = 2
    work = tempfile.mkdtemp(prefix="raymetal-bench-operations-")
    lab = Lab(args, work)
    try:
        print("lab up and deploy (not timed) ...", flush=True)
        lab.up()
        playbook(lab, "site.yml")
        rows = measure(Cluster(lab), lab)
    except BenchError as err:
        print("bench failed: %s\nlogs: %s" % (err, work), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        lab.down()
    print("\nDay-2 operations on a 3-node lab (load %.2f):" % os.getloadavg()[0])
    print("  %-48s %9s  %-17s %s" % ("figure", "seconds", "workers restarted", "target"))
    for label, took, restarted, target in rows:
        print("  %-48s %9.1f  %-17s %s" % (label, took, "-" if restarted is None else restarted,
                                           "" if target is None else "%s: %s" % (target[1],
                                                                                  "MET" if target[0] else "MISSED")))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
