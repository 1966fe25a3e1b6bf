#!/usr/bin/env python3
"""Time playbooks/acceptance.yml on labs of growing size, in one run, to show how its cost grows.

For each size (default 3 and 6 nodes) a private lab is created with lab/lab.sh (LAB_PREFIX=raybench-acc,
subnets 10.231.220.0/24 and 10.231.230.0/24 by default), deployed with site.yml (not timed), then the
acceptance playbook runs twice: the first run installs iperf3 from the lab's mirror, the second is the
steady state that a site runs again and again. The lab is removed after each size, and always at the end.

The rings run all pairs at once, so the wall time should stay nearly flat as nodes are added; the target
is growth no worse than linear: t(largest) / t(smallest) <= nodes(largest) / nodes(smallest).

Usage (from the repository root):
    .venv/bin/python bench/acceptance/run.py
    .venv/bin/python bench/acceptance/run.py --sizes 3 5 8
Exits 0 when every phase ran (MET or MISSED is printed), 1 on an error, 130 when interrupted.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deploy"))

from run import BIN, REPO, BenchError, Lab  # noqa: E402  (bench/deploy/run.py, the bench lab)


def timed_playbook(playbook, inventory, logfile):
    """Seconds ansible-playbook took, and its exit status (output appended to logfile)."""
    start = time.monotonic()
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inventory, playbook], cwd=REPO,
                          capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    with open(logfile, "a", encoding="utf-8") as fh:
        fh.write("$ ansible-playbook -i %s %s\n%s%s\n" % (inventory, playbook, proc.stdout, proc.stderr))
    return took, proc.returncode, proc.stdout[-3000:]


def measure(args, nodes, work):
    """(deploy s, first acceptance s, steady acceptance s) on a fresh lab of `nodes` nodes."""
    lab_args = argparse.Namespace(prefix=args.prefix, mgmt_subnet=args.mgmt_subnet,
                                  fabric_subnet=args.fabric_subnet, workers=nodes - 1)
    lab_work = os.path.join(work, "lab-%d" % nodes)
    os.makedirs(lab_work)
    lab = Lab(lab_args, lab_work)
    try:
        print("  %d nodes: lab up ..." % nodes, flush=True)
        lab.up()
        inventory = os.path.join(lab.inventory_dir, "hosts.yml")
        deploy, rc, tail = timed_playbook("site.yml", inventory, lab.logfile)
        if rc != 0:
            raise BenchError("site.yml failed on the %d-node lab (rc=%d):\n%s" % (nodes, rc, tail))
        print("  %d nodes: deployed in %.1f s (not part of the figure)" % (nodes, deploy), flush=True)
        runs = []
        for label in ("first (installs iperf3)", "steady"):
            took, rc, tail = timed_playbook("playbooks/acceptance.yml", inventory, lab.logfile)
            if rc != 0:
                raise BenchError("acceptance.yml failed on the %d-node lab (rc=%d):\n%s" % (nodes, rc, tail))
            print("  %d nodes: acceptance %s %.1f s (load %.2f)" % (nodes, label, took, os.getloadavg()[0]),
                  flush=True)
            runs.append(took)
        return deploy, runs[0], runs[1]
    finally:
        lab.down()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 6], help="lab sizes in nodes (default 3 6)")
    parser.add_argument("--prefix", default="raybench-acc")
    parser.add_argument("--mgmt-subnet", default="10.231.220.0/24")
    parser.add_argument("--fabric-subnet", default="10.231.230.0/24")
    args = parser.parse_args()
    sizes = sorted(set(args.sizes))
    if len(sizes) < 2 or sizes[0] < 2:
        parser.error("give at least two sizes of 2 nodes or more")
    work = tempfile.mkdtemp(prefix="raymetal-bench-acceptance-")
    results = {}
    try:
        for nodes in sizes:
            results[nodes] = measure(args, nodes, work)
    except BenchError as err:
        print("bench failed: %s\nlogs: %s" % (err, work), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    print("\nacceptance.yml (node checks, iperf3 ring, Ray object ring, report), seconds:")
    print("  %-6s %-10s %-10s %-10s %s" % ("nodes", "deploy", "first", "steady", "steady per node"))
    for nodes in sizes:
        deploy, first, steady = results[nodes]
        print("  %-6d %-10.1f %-10.1f %-10.1f %.1f" % (nodes, deploy, first, steady, steady / nodes))
    small, large = sizes[0], sizes[-1]
    growth = results[large][2] / results[small][2]
    bound = large / small
    slope = (results[large][2] - results[small][2]) / (large - small)
    print("\nsteady run: %.2fx the time for %.2fx the nodes (%.1f s more per added node); "
          "target no worse than linear (<= %.2fx): %s" % (growth, bound, slope, bound,
                                                          "MET" if growth <= bound else "MISSED"))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
