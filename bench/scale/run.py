#!/usr/bin/env python3
"""What one controller pays per host: a fresh deploy and a no-op rerun on labs of 3, 8 and 16 nodes, in one run.

For each size a private lab is started with lab/lab.sh (LAB_PREFIX=rayscale, subnets 10.231.200.0/24 and
10.231.210.0/24 by default; not timed), then:

  floor     (smallest size only) the same cluster by hand, no Ansible: bench/deploy/run.py's floor (docker cp
            of the wheelhouse into every node, one offline pip run per node, ray start under systemd-run)
  deploy    `ansible-playbook site.yml` on the fresh lab
  rerun     the same command again: the no-op rerun as users run it (changed=0 expected everywhere); the deploy
            left its record on every node, so this is the fast path (one probe per node, then the summary);
            three times (--reruns), and the run of median controller CPU is the one judged
  full      the same command with -e raymetal_fast_path=false: every task on every host, what a rerun costs
            after any change to the inventory, the code or one node (changed=0 expected too)

and the lab is removed again. Measured for each run: wall time, the controller's CPU seconds (this script's
children: ansible-playbook, its workers, ssh, rsync), the nodes' CPU seconds (their cgroups), and the bytes the
controller sent to the lab (the transmit counters of the lab's two Docker bridges: what this machine's own
network stack sent into them; node-to-node traffic, the wheelhouse mirror's included, and the lab's apt mirror
container never pass through them).

Printed: one row per size and run, the per-host figures, the least-squares line of controller CPU seconds
against hosts (the slope is what each further host costs), and the goals of issue 16 with MET or MISSED:
  - bytes sent for a fresh deploy of 8 nodes within 10 % of 3 nodes' (the wheelhouse leaves the controller once)
  - fresh deploy of the smallest lab at most 1.25x the floor (wall)
  - no-op rerun: at most 1 controller CPU second per host (the slope), and at most 6 s wall on 3 nodes (judged on
    the rerun as users run it; the full path's figures are printed beside it)

Usage (from the repository root; the lab image and wheelhouse built, e.g. by `bash lab/lab.sh image wheelhouse`):
    .venv/bin/python bench/scale/run.py
    .venv/bin/python bench/scale/run.py --sizes 3 8 --no-floor --prefix rm16s \\
        --mgmt-subnet 10.231.72.0/24 --fabric-subnet 10.231.73.0/24
Exits 0 when every phase ran (goals MET or MISSED are printed), 1 on an error, 130 when interrupted.
"""

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC = importlib.util.spec_from_file_location("deploy_bench", os.path.join(os.path.dirname(HERE), "deploy", "run.py"))
deploy_bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(deploy_bench)

BIN, REPO, BenchError, Lab = deploy_bench.BIN, deploy_bench.REPO, deploy_bench.BenchError, deploy_bench.Lab

GOAL_BYTES_GROWTH = 1.10      # bytes(8 nodes) / bytes(3 nodes)
GOAL_FLOOR_RATIO = 1.25       # fresh deploy / floor, wall
GOAL_RERUN_CPU_PER_HOST = 1.0  # controller CPU seconds per host, no-op rerun
GOAL_RERUN_WALL_3 = 6.0       # seconds, no-op rerun on 3 nodes
GOAL_DEMAND_RATIO = 1.3       # issue 37, goal 4: fresh deploy's CPU demand (nodes + controller) / the floor's


def log(msg):
    print("[scale] " + msg, flush=True)


def bridge_tx_bytes(prefix):
    """Bytes this machine's network stack has sent into the lab's two bridges (management and fabric)."""
    total = 0
    for net in ("mgmt", "fabric"):
        proc = subprocess.run(["docker", "network", "inspect", "-f", "{{.Id}}", "%s-%s" % (prefix, net)],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BenchError("docker network inspect %s-%s failed: %s" % (prefix, net, proc.stderr.strip()))
        path = "/sys/class/net/br-%s/statistics/tx_bytes" % proc.stdout.strip()[:12]
        try:
            with open(path, encoding="ascii") as fh:
                total += int(fh.read())
        except OSError as err:
            raise BenchError("cannot read %s (the lab's bridge): %s" % (path, err)) from err
    return total


FAST_PATH_SIGN = "Only the cluster summary runs"  # playbooks/fast_path.yml's message when every node matches


def playbook(lab, label, extra_vars, strategy):
    """ansible-playbook site.yml on the lab; (PLAY RECAP counts per host, bytes sent, "fast" or "full": the path
    the run took). Raises on failure."""
    logfile = os.path.join(lab.work, label.replace(" ", "-") + ".log")
    env = deploy_bench.ansible_env(lab.work, REPO, strategy)
    if not label.startswith("deploy"):
        # profile_tasks (the slowest tasks of the fresh deploy, printed at the end) only where a few tenths of a
        # second of its own work are lost in the deploy's noise; the reruns run without it.
        env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    cmd = [os.path.join(BIN, "ansible-playbook"), "site.yml", "-i", lab.inventory_dir]
    for extra in extra_vars:
        cmd += ["-e", extra]
    sent0 = bridge_tx_bytes(lab.prefix)
    with open(logfile, "w", encoding="utf-8") as fh:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    sent = bridge_tx_bytes(lab.prefix) - sent0
    with open(logfile, encoding="utf-8") as fh:
        text = fh.read()
    if proc.returncode != 0:
        raise BenchError("%s: site.yml failed (rc=%d); log %s, tail:\n%s" % (label, proc.returncode, logfile,
                                                                          text[-4000:]))
    profile, recap = deploy_bench.parse_output(text)
    lab.profiles = getattr(lab, "profiles", {})
    lab.profiles[label] = profile
    return recap, sent, "fast" if FAST_PATH_SIGN in text else "full"


def fit(points):
    """Least-squares line through (x, y) points: (slope, intercept); None with fewer than 2 distinct x."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        return None
    mean_x = sum(xs) / len(xs)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return slope, mean_y - slope * mean_x


def measure_size(args, nodes, work, with_floor):
    lab_args = argparse.Namespace(prefix=args.prefix, mgmt_subnet=args.mgmt_subnet,
                                  fabric_subnet=args.fabric_subnet, workers=nodes - 1)
    lab_work = os.path.join(work, "lab-%d" % nodes)
    os.makedirs(lab_work)
    lab = Lab(lab_args, lab_work)
    row = {"nodes": nodes}
    try:
        if with_floor:
            log("%d nodes: fresh lab for the floor (not timed)" % nodes)
            lab.up()
            steps, m = deploy_bench.measured(lab, "floor", lambda: deploy_bench.floor(lab, "floor"))
            row["floor"] = m
            log("%d nodes: floor %.1f s (%s)" % (nodes, m["wall"], ", ".join(
                "%s %.1f s" % (k, v) for k, v in steps.items() if k != "total")))
            lab.down()
        log("%d nodes: fresh lab (not timed)" % nodes)
        lab.up()
        # The no-op rerun several times: its few seconds move by a tenth or two between runs on a shared
        # machine; the one with the median controller CPU stands for the size, all are printed.
        phases = ([("deploy", args.strategy, [])] + [("rerun", args.strategy, [])] * args.reruns
                  + [("full", args.strategy, ["raymetal_fast_path=false"])])
        if args.compare_strategy:
            phases.append(("rerun+", args.compare_strategy, ["raymetal_fast_path=false"]))
        for i, (phase, strategy, extra) in enumerate(phases):
            # Each run its own log (rerun-3-2.log: the second phase of 3 nodes).
            label = "%s-%d-%d" % (phase, nodes, i) if phase == "rerun" else "%s-%d" % (phase, nodes)
            try:
                (recap, sent, path), m = deploy_bench.measured(lab, "%s, %d nodes" % (phase, nodes),
                                                               lambda st=strategy, e=extra, lb=label: playbook(
                                                                   lab, lb, args.extra_vars + e, st))
            except BenchError as err:
                if phase != "rerun+":
                    raise
                # The comparison is an extra: its failure is reported, the figures of the run stand.
                log("%d nodes: the rerun with %s failed, left out: %s" % (nodes, strategy, str(err)[:300]))
                continue
            m["sent"] = sent
            m["path"] = path
            m["changed"] = dict((h, c["changed"]) for h, c in recap.items() if c["changed"])
            m["profile"] = getattr(lab, "profiles", {}).get(label, [])
            if phase == "rerun":
                row.setdefault("reruns", []).append(m)
            else:
                row[phase] = m
            log("%d nodes: %s (%s path) %.1f s wall, %.1f controller CPU s, %.1f MB sent, changed %s"
                % (nodes, phase, path, m["wall"], m["controller_cpu"], sent / 1e6, m["changed"] or "0 everywhere"))
        reruns = sorted(row["reruns"], key=lambda r: r["controller_cpu"])
        row["rerun"] = reruns[(len(reruns) - 1) // 2]
    finally:
        lab.down()
    return row


PHASES = ("deploy", "rerun", "full", "rerun+")


def verdict(ok):
    return "MET" if ok else "MISSED"


def report(args, rows):
    print()
    print("Scale benchmark: fresh deploy and no-op rerun of site.yml per lab size, controller with %d CPUs, "
          "strategy %s" % (os.cpu_count() or 0, args.strategy or "ansible.cfg's (linear)"))
    if args.extra_vars:
        print("extra vars: %s" % " ".join(args.extra_vars))
    print()
    head = "%5s  %-8s %-5s %8s %9s %9s %10s %9s %9s  %s" % (
        "nodes", "run", "path", "wall s", "ctl CPU", "ctl/host", "MB sent", "MB/host", "node CPU", "load 1m b/a")
    print(head)
    print("-" * len(head))
    for row in rows:
        n = row["nodes"]
        if "floor" in row:
            m = row["floor"]
            print("%5d  %-8s %-5s %8.1f %9.1f %9.2f %10s %9s %9s  %.1f/%.1f" % (
                n, "floor", "", m["wall"], m["controller_cpu"], m["controller_cpu"] / n, "(docker)", "",
                deploy_bench.fmt(m["node_cpu"]), m["load_before"], m["load_after"]))
        for phase in PHASES:
            if phase not in row:
                continue
            m = row[phase]
            print("%5d  %-8s %-5s %8.1f %9.1f %9.2f %10.1f %9.1f %9s  %.1f/%.1f" % (
                n, phase, m["path"], m["wall"], m["controller_cpu"], m["controller_cpu"] / n, m["sent"] / 1e6,
                m["sent"] / 1e6 / n, deploy_bench.fmt(m["node_cpu"]), m["load_before"], m["load_after"]))
    print("-" * len(head))
    print("ctl CPU: CPU seconds of this script's children (ansible-playbook, its workers, ssh, rsync); MB sent: "
          "what the controller sent into the lab's bridges; node CPU: the containers' cgroups.")
    print("rerun: the no-op rerun as users run it (the one of median controller CPU of %d; all: %s)."
          % (args.reruns, "; ".join("%d nodes %s s" % (row["nodes"], ", ".join(
              "%.2f" % r["controller_cpu"] for r in row.get("reruns", []))) for row in rows)))
    print("full: the same with -e raymetal_fast_path=false (every task "
          "on every host: what a rerun costs after any change); path: which one the run took (fast: only the "
          "probe and the summary).")
    if args.compare_strategy:
        print("rerun+: one more full no-op rerun with ANSIBLE_STRATEGY=%s, for comparison only (the goals are judged "
              "on the rerun above)." % args.compare_strategy)
    print()
    lines = {}
    for phase in PHASES:
        if any(phase not in row for row in rows) or len(rows) < 2:
            continue
        line = fit([(row["nodes"], row[phase]["controller_cpu"]) for row in rows])
        lines[phase] = line
        if line:
            print("controller CPU of the %-6s = %.2f s + %.3f s per host (least squares over %s nodes)"
                  % (phase, line[1], line[0], ", ".join(str(r["nodes"]) for r in rows)))
    print()
    print("Goals (issue 16):")
    by_nodes = dict((row["nodes"], row) for row in rows)
    small = rows[0]
    if 3 in by_nodes and 8 in by_nodes:
        growth = by_nodes[8]["deploy"]["sent"] / by_nodes[3]["deploy"]["sent"]
        print("  bytes sent, fresh deploy, 8 nodes / 3 nodes: %.1f MB / %.1f MB = %.2fx  goal <= %.2fx: %s"
              % (by_nodes[8]["deploy"]["sent"] / 1e6, by_nodes[3]["deploy"]["sent"] / 1e6, growth,
                 GOAL_BYTES_GROWTH, verdict(growth <= GOAL_BYTES_GROWTH)))
    else:
        print("  bytes sent 8 / 3 nodes: not measured (needs --sizes with 3 and 8)")
    if "floor" in small:
        ratio = small["deploy"]["wall"] / small["floor"]["wall"]
        print("  fresh deploy / floor, %d nodes (wall): %.1f s / %.1f s = %.2fx  goal <= %.2fx: %s"
              % (small["nodes"], small["deploy"]["wall"], small["floor"]["wall"], ratio, GOAL_FLOOR_RATIO,
                 verdict(ratio <= GOAL_FLOOR_RATIO)))
        # What the 1.25x asks of this machine: the deploy's own CPU demand (its nodes' and the controller's) spread
        # over every core of a machine that is controller and cluster at once is the least wall it can take.
        deploy_m, floor_m, cores = small["deploy"], small["floor"], os.cpu_count() or 1
        if deploy_m["node_cpu"] is not None and floor_m["node_cpu"] is not None:
            demand = deploy_m["node_cpu"] + deploy_m["controller_cpu"]
            floor_demand = floor_m["node_cpu"] + floor_m["controller_cpu"]
            print("    CPU demand: deploy %.1f s (nodes %.1f + controller %.1f), floor %.1f s (nodes %.1f + controller "
                  "%.1f) = %.2fx; on these %d CPUs the deploy cannot take less than %.1f s of wall = %.2fx the floor"
                  % (demand, deploy_m["node_cpu"], deploy_m["controller_cpu"], floor_demand, floor_m["node_cpu"],
                     floor_m["controller_cpu"], demand / floor_demand, cores, demand / cores,
                     demand / cores / floor_m["wall"]))
            print("  fresh deploy's CPU demand / the floor's, %d nodes (issue 37, goal 4): %.2fx  goal <= %.1fx: %s"
                  % (small["nodes"], demand / floor_demand, GOAL_DEMAND_RATIO,
                     verdict(demand / floor_demand <= GOAL_DEMAND_RATIO)))
        else:
            print("  fresh deploy's CPU demand / the floor's (issue 37, goal 4): not measured (no node CPU: cgroups "
                  "unreadable)")
    else:
        print("  fresh deploy / floor: not measured (--no-floor)")
    if lines.get("rerun"):
        slope = lines["rerun"][0]
        print("  no-op rerun, controller CPU per further host (slope): %.2f s  goal <= %.1f s: %s"
              % (slope, GOAL_RERUN_CPU_PER_HOST, verdict(slope <= GOAL_RERUN_CPU_PER_HOST)))
    for row in rows:
        per_host = row["rerun"]["controller_cpu"] / row["nodes"]
        print("  no-op rerun, controller CPU / hosts at %2d nodes (fixed cost shared out): %.2f s  goal <= %.1f s: %s"
              % (row["nodes"], per_host, GOAL_RERUN_CPU_PER_HOST, verdict(per_host <= GOAL_RERUN_CPU_PER_HOST)))
    if 3 in by_nodes:
        wall = by_nodes[3]["rerun"]["wall"]
        print("  no-op rerun wall, 3 nodes: %.1f s  goal <= %.0f s: %s"
              % (wall, GOAL_RERUN_WALL_3, verdict(wall <= GOAL_RERUN_WALL_3)))
    slow = ["%d nodes" % row["nodes"] for row in rows if any(r["path"] != "fast" for r in row["reruns"])]
    print("  no-op rerun took the fast path: %s" % ("at every size" if not slow else "NO at " + ", ".join(slow)))
    for phase in ("rerun", "full"):
        runs = dict((row["nodes"], row["reruns"] if phase == "rerun" else [row[phase]]) for row in rows)
        changed = dict((n, [r["changed"] for r in rs if r["changed"]]) for n, rs in runs.items()
                       if any(r["changed"] for r in rs))
        print("  %s changed: %s" % ("no-op rerun" if phase == "rerun" else "full-path rerun",
                                    changed or "0 on every host of every size"))
    for row in rows[:1]:
        print()
        print("Slowest tasks of the fresh deploy, %d nodes (profile_tasks: wall time of each task, all hosts):"
              % row["nodes"])
        for task, secs in row["deploy"]["profile"][:12]:
            print("  %7.2f s  %s" % (secs, task))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 8, 16], help="lab sizes in nodes (default 3 8 16)")
    parser.add_argument("--reruns", type=int, default=3,
                        help="no-op reruns per size; the one of median controller CPU is judged (default 3)")
    parser.add_argument("--no-floor", action="store_true", help="leave out the by-hand floor (smallest size)")
    parser.add_argument("--prefix", default="rayscale", help="LAB_PREFIX of the bench lab (default rayscale)")
    parser.add_argument("--mgmt-subnet", default="10.231.200.0/24")
    parser.add_argument("--fabric-subnet", default="10.231.210.0/24")
    parser.add_argument("--strategy", help="ANSIBLE_STRATEGY for every run (default: ansible.cfg's)")
    parser.add_argument("--compare-strategy", metavar="S",
                        help="one more no-op rerun per size with ANSIBLE_STRATEGY=S (e.g. free), "
                             "printed beside the others")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS")
    parser.add_argument("--keep-logs", action="store_true", help="keep the work dir (logs) after a successful run")
    args = parser.parse_args()
    if args.prefix == "raymetal":
        sys.exit("--prefix raymetal is the main lab's; the bench needs a lab of its own")
    if any(n < 1 or n > 21 for n in args.sizes):
        sys.exit("--sizes: 1 to 21 nodes (lab/lab.sh starts at most 20 workers)")
    args.sizes = sorted(set(args.sizes))
    if args.reruns < 1:
        sys.exit("--reruns: at least 1")

    def on_term(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)

    work = tempfile.mkdtemp(prefix="raymetal-scale-")
    log("work dir %s; sizes %s; %s" % (work, " ".join(map(str, args.sizes)), deploy_bench.load()))
    rows = []
    leftover = Lab(argparse.Namespace(prefix=args.prefix, mgmt_subnet=args.mgmt_subnet,
                                      fabric_subnet=args.fabric_subnet, workers=0), os.path.join(work, "leftover"))
    if leftover.leftovers():
        log("removing a %s lab left from an earlier run" % args.prefix)
        leftover.down()

    def sizes():
        for i, nodes in enumerate(args.sizes):
            rows.append(measure_size(args, nodes, work, with_floor=(i == 0 and not args.no_floor)))

    rc = deploy_bench.guarded(sizes, leftover.down, work, args.keep_logs)
    if rc is not None:
        return rc
    report(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
