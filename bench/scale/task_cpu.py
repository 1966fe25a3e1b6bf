#!/usr/bin/env python3
"""Where the full path's controller CPU goes, task by task, on a deployed lab.

issue 37 asks for a full path of at most 2 controller CPU-seconds per host; the suite (issue 34) runs the full path
dozens of times. This prints what one full-path no-op rerun (`site.yml -e raymetal_fast_path=false` on a cluster that
is already deployed) costs the controller, charged to each task by a bench-only callback
(bench/scale/callbacks/task_cpu.py: ansible-playbook's CPU and its reaped children's between two task starts), with
the nodes' CPU from the containers' cgroups beside it:

- the whole run: wall, controller CPU (getrusage of the ansible-playbook child), nodes' CPU, task-host pairs and
  how many of them were skips;
- the controller CPU of each play;
- the tasks that every host skipped, and what evaluating those skips cost (a skipped task still forks a worker
  per host and templates its condition: grouping such tasks under one include is a lever);
- the most expensive tasks.

    make lab-up && .venv/bin/ansible-playbook site.yml -i inventory/lab     # a deployed lab (not timed)
    .venv/bin/python bench/scale/task_cpu.py                               # inventory/lab, 2 runs, the cheaper printed
    .venv/bin/python bench/scale/task_cpu.py -i lab/.labs/<prefix>/inventory --runs 3

Only the lab's own containers are contacted. Figures move by a few tenths between runs on a shared machine: the
run with the least controller CPU is the one printed, and every run's total is listed.
"""

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, ".venv", "bin")
# The deploy bench's reading of the containers' cgroups (bench/scale/run.py loads it the same way).
_SPEC = importlib.util.spec_from_file_location("deploy_bench", os.path.join(ROOT, "bench", "deploy", "run.py"))
deploy_bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(deploy_bench)


def hosts_of(inventory):
    listed = subprocess.run([os.path.join(BIN, "ansible-inventory"), "-i", inventory, "--list"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    return sorted(h for h in json.loads(listed).get("_meta", {}).get("hostvars", {}) if h != "localhost")


def nodes_cpu(hosts):
    """CPU seconds of the hosts' containers so far (bench/deploy/run.py reads their cgroups), or None."""
    ids = subprocess.run(["docker", "inspect", "-f", "{{.Id}}", *hosts], capture_output=True, text=True,
                         check=False).stdout.split()
    return deploy_bench.containers_cpu_seconds(ids) if len(ids) == len(hosts) else None


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_run(inventory, hosts, extra):
    with tempfile.NamedTemporaryFile(prefix="task-cpu-", suffix=".tsv", delete=False) as fh:
        out = fh.name
    env = dict(os.environ, ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, "bench", "scale", "callbacks"),
               ANSIBLE_CALLBACKS_ENABLED="task_cpu", RAYMETAL_TASK_CPU_OUT=out)
    cmd = [os.path.join(BIN, "ansible-playbook"), "site.yml", "-i", inventory, *extra]
    nodes0, cpu0, wall0 = nodes_cpu(hosts), children_cpu(), time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall, cpu, nodes1 = time.monotonic() - wall0, children_cpu() - cpu0, nodes_cpu(hosts)
    nodes = None if nodes0 is None or nodes1 is None else nodes1 - nodes0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    rows = []
    with open(out, encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                cost, ran, skipped, play, name = line.rstrip("\n").split("\t")
                rows.append((float(cost), int(ran), int(skipped), play, name))
    os.unlink(out)
    # The recap's changed= counts, summed over the hosts: a no-op rerun must say 0.
    changed = sum(int(part.split("=", 1)[1]) for part in proc.stdout.split() if part.startswith("changed="))
    return {"wall": wall, "cpu": cpu, "nodes": nodes, "rows": rows, "changed": changed}


def report(run, hosts, inventory, top):
    rows = run["rows"]
    pairs = sum(r[1] for r in rows)
    skips = sum(r[2] for r in rows)
    print(f"\nfull-path no-op rerun on {len(hosts)} hosts ({inventory}): {run['wall']:.1f} s wall, controller "
          f"{run['cpu']:.1f} CPU-s ({run['cpu'] / len(hosts):.2f} per host), nodes {deploy_bench.fmt(run['nodes'])} "
          f"CPU-s (idle Ray included), changed={run['changed']}")
    print(f"task-host pairs: {pairs} ({skips} skipped); controller CPU per pair {run['cpu'] / max(pairs, 1) * 1000:.0f} ms")
    by_play = defaultdict(lambda: [0.0, 0])
    for cost, ran, _skipped, play, _name in rows:
        by_play[play][0] += cost
        by_play[play][1] += ran
    print("\n  CPU-s   pairs  play")
    for play, (cost, ran) in sorted(by_play.items(), key=lambda kv: -kv[1][0]):
        print(f"  {cost:5.2f}  {ran:6d}  {play or '(before the first play)'}")
    all_skipped = [r for r in rows if r[1] and r[1] == r[2]]
    cost_skipped = sum(r[0] for r in all_skipped)
    print(f"\ntasks every host skipped: {len(all_skipped)} of {len(rows)}, {cost_skipped:.2f} CPU-s "
          f"({cost_skipped / max(run['cpu'], 1e-9) * 100:.0f} % of the run)")
    print(f"\nthe {top} tasks that cost the most:\n  CPU-s  hosts skipped  play | task")
    for cost, ran, skipped, play, name in sorted(rows, key=lambda r: -r[0])[:top]:
        print(f"  {cost:5.2f}  {ran:5d}  {skipped:7d}  {play[:40]} | {name[:90]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-i", "--inventory", default="inventory/lab", help="a deployed lab's inventory")
    parser.add_argument("--runs", type=int, default=2, help="full-path runs; the cheapest is printed (default 2)")
    parser.add_argument("--top", type=int, default=15, help="how many of the most expensive tasks to list")
    args = parser.parse_args()
    hosts = hosts_of(args.inventory)
    runs = [one_run(args.inventory, hosts, ["-e", "raymetal_fast_path=false"]) for _ in range(args.runs)]
    print("controller CPU-s of each run: " + ", ".join(f"{r['cpu']:.1f}" for r in runs))
    report(min(runs, key=lambda r: r["cpu"]), hosts, args.inventory, args.top)


if __name__ == "__main__":
    main()
