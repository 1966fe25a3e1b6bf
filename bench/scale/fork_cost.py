#!/usr/bin/env python3
"""What one fork costs a Python process as its memory grows: the planner's per-task price.

ansible-core's linear strategy forks a worker from ansible-playbook's own process for every task on every
host. The planner's memory grows with the hosts (their variables, facts and results), and fork copies the
parent's page tables, so each fork costs more as the inventory grows: a per-task-and-host cost that grows
with the hosts, which makes the planner's CPU grow with their square. This measures that price alone, on
this machine: a Python process holding about N MB of small dicts and strings (shaped like hostvars) forks a
child that exits at once, many times; the parent's own CPU per fork (user + system, getrusage) is printed for
each size, with the slope in ms per 100 MB. No network, no Ansible.

    .venv/bin/python bench/scale/fork_cost.py                   # 50 100 200 400 MB, 200 forks each
    .venv/bin/python bench/scale/fork_cost.py --sizes 100 800 --forks 100
"""

import argparse
import importlib.util
import os
import resource
import sys

# The scale bench's least-squares line (bench/scale/run.py).
_SPEC = importlib.util.spec_from_file_location("scale_bench", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                          "run.py"))
scale_bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(scale_bench)


def rss_mb():
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def grow_to(ballast, target_mb):
    """Add host-variable-shaped dicts until the process holds about target_mb."""
    i = len(ballast)
    while rss_mb() < target_mb:
        for _ in range(2000):
            ballast.append({"ansible_host": "10.0.%d.%d" % (i // 250 % 250, i % 250), "index": i,
                            "labels": ["rack-%d" % (i % 40), "gpu"], "text": "x" * 200})
            i += 1


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fork_cost(forks):
    """The parent's CPU seconds per fork (a child that exits at once, reaped before the next)."""
    start = cpu()
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return (cpu() - start) / forks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400], help="process sizes in MB")
    parser.add_argument("--forks", type=int, default=200, help="forks measured at each size")
    args = parser.parse_args()
    ballast, rows = [], []
    print("%8s %8s %12s" % ("RSS MB", "forks", "ms per fork"))
    for size in sorted(args.sizes):
        grow_to(ballast, size)
        fork_cost(10)  # warm-up
        ms = fork_cost(args.forks) * 1000
        rows.append((rss_mb(), ms))
        print("%8.0f %8d %12.2f" % (rows[-1][0], args.forks, ms), flush=True)
    line = scale_bench.fit(rows)
    if line:
        slope, intercept = line
        print("least squares: %.2f ms + %.2f ms per 100 MB of the forking process" % (intercept, slope * 100))
    return 0


if __name__ == "__main__":
    sys.exit(main())
