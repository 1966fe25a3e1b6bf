#!/usr/bin/env python3
"""The node health loop's figures on a lab of its own, in one run (issue 36): per fault kind, how long from
the fault to the drain, to Ray stopped and to the alert delivered, and from the fix to ALIVE; then the loop's
CPU on every node.

A fresh 3-node lab (LAB_PREFIX=raybench-health, subnets 10.231.227.0/24 and 10.231.237.0/24 by default) is
deployed with site.yml (not timed) with the health loop on at its defaults (a round every 15 s, 4 passing
rounds to re-admit; --interval and --passes change them), monitoring on as the lab has it, and Alertmanager
sending to a webhook receiver on the head's loopback that notes when each notification arrives (group_wait 1 s,
group_interval 10 s: the figure is the loop's and Prometheus's path, not Alertmanager's batching). Each
worker's Ray temp dir is a tmpfs of its own (the lab's nodes share the host's disk). Then, on worker1:

  fabric_link   ip link set ib0 down; fixed by ip link set ib0 up (no drain: it would go over that link)
  temp_dir      fallocate fills Ray's temp dir below health_temp_dir_min_free_mib; fixed by removing the file

Each row: fault -> drained (the loop's record), -> Ray stopped (the unit inactive), -> alert delivered
(the first notification at the webhook with an alert firing for that node, named in the row: off the
fabric Prometheus cannot scrape the node's quarantine metric, so RayNodeDown or NodeExporterDown tells it
there), and fix -> ALIVE at the head (the loop re-admits by itself).
A hardware fault (Xid 79) is not made here: /dev/kmsg in a lab node is the host's kernel log, which every
node's loop reads (the unit tests and tests/fixtures cover it).

CPU: the loop's process (utime + stime of it and of the commands it waited for, /proc/PID/stat) on every node
over --cpu-window seconds (600: the issue's 10 minutes), as a percentage of one core. Goal (issue 36): under
1 % of one core; printed MET or MISSED.

Usage (from the repository root, with nothing else running on the machine):
    .venv/bin/python bench/health/run.py [--cpu-window 600]
Exits 0 when every phase ran (MET or MISSED is printed), 1 on an error, 130 when interrupted.
"""

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time

import yaml

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(BENCH, "deploy"))

from run import BenchError, Lab, guarded, log, site  # noqa: E402  (bench/deploy/run.py, the bench lab)

# bench/operations/run.py's sh() and Cluster (its own `from run import` finds bench/deploy/run.py, loaded above).
_SPEC = importlib.util.spec_from_file_location("bench_operations", os.path.join(BENCH, "operations", "run.py"))
operations = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(operations)
sh = operations.sh

STATE = "/var/lib/raymetal-health/state.json"
TMPFS = "/srv/raymetal-bench-tmp"
FILL = TMPFS + "/raymetal-bench-fill"
HOOK_LOG = "/tmp/raymetal-bench-webhook.log"
HOOK_PORT = 9099
# The lab's webhook receiver (lab/webhook_recorder.py) on the head's loopback (Alertmanager's only client is
# Prometheus's host, itself): each POST is one line, the time it arrived and the alerts' names, hosts and status.
_HOOK_SPEC = importlib.util.spec_from_file_location(
    "webhook_recorder", os.path.join(os.path.dirname(BENCH), "lab", "webhook_recorder.py"))
webhook_recorder = importlib.util.module_from_spec(_HOOK_SPEC)
_HOOK_SPEC.loader.exec_module(webhook_recorder)


def state(name):
    out = sh(name, "cat %s 2>/dev/null" % STATE, check=False).stdout
    return json.loads(out) if out.strip() else {}


def unit_active(name):
    return sh(name, "systemctl is-active ray-worker", check=False).stdout.strip() == "active"


def hook_seen(head, host, after=0.0):
    """(when, alert names) of the first notification after `after` with an alert firing for host (None: not yet)."""
    return webhook_recorder.first_firing(sh(head, "cat %s 2>/dev/null" % HOOK_LOG, check=False).stdout, host, after)


def wait(predicate, timeout, what):
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise BenchError("timed out after %d s waiting for %s" % (timeout, what))


def loop_cpu_seconds(name):
    """CPU seconds of the health loop's process and the commands it waited for."""
    pid = sh(name, "systemctl show -p MainPID --value raymetal-health").stdout.strip()
    fields = sh(name, "cat /proc/%s/stat" % pid).stdout.rsplit(")", 1)[1].split()
    ticks = int(sh(name, "getconf CLK_TCK").stdout.strip())
    # Fields 14-17 of /proc/PID/stat (utime, stime, cutime, cstime); after the ")" they are 12-15 (1-based).
    return pid, sum(int(v) for v in fields[11:15]) / ticks


def fault(lab, worker, ip, kind):
    """One fault on worker and its fix: the row's figures (seconds)."""
    head = lab.head[0]
    cluster = operations.Cluster(lab)
    # The node's Ray ID before the fault: ALIVE again means a new one (the head keeps the old one ALIVE until its
    # health check gives up on it, up to a minute after the node stopped).
    before = cluster.alive().get(ip)
    t0 = time.time()
    if kind == "fabric_link":
        sh(worker, "ip link set ib0 down")
    else:
        sh(worker, "fallocate -l 220M %s" % FILL)
    wait(lambda: not unit_active(worker), 180, "%s: Ray stopped on %s" % (kind, worker))
    stopped = time.time()
    record = wait(lambda: state(worker).get("record"), 30, "%s: the record" % kind)
    if record.get("check") != kind:
        raise BenchError("%s: the loop recorded %s" % (kind, record))
    alert, names = wait(lambda: hook_seen(head, worker, after=t0), 300, "%s: an alert at the webhook" % kind)
    t_fix = time.time()
    if kind == "fabric_link":
        sh(worker, "ip link set ib0 up; ip -4 -o address show dev ib0 | grep -qw %s || "
                   "ip address add %s/24 dev ib0" % (ip, ip))
    else:
        sh(worker, "rm -f %s" % FILL)
    wait(lambda: cluster.alive().get(ip) not in (None, before), 600, "%s: %s ALIVE again" % (kind, worker))
    if state(worker).get("record"):
        raise BenchError("%s: %s is ALIVE but its loop still holds %s" % (kind, worker, state(worker)["record"]))
    alive = time.time()
    return {"kind": kind, "drained": record.get("drained_at", 0) - t0 if "drained_at" in record else None,
            "stopped": min(stopped, record.get("stopped_at", stopped)) - t0, "alert": alert - t0,
            "alive": alive - t_fix, "alerts": names}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default="raybench-health")
    parser.add_argument("--mgmt-subnet", default="10.231.227.0/24")
    parser.add_argument("--fabric-subnet", default="10.231.237.0/24")
    parser.add_argument("--interval", type=int, default=15, help="health_interval_s (default 15, the role's)")
    parser.add_argument("--passes", type=int, default=4, help="health_readmit_passes (default 4, the role's)")
    parser.add_argument("--cpu-window", type=int, default=600, help="seconds the loop's CPU is measured over")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    args.workers = 2
    work = tempfile.mkdtemp(prefix="raymetal-bench-health-")
    lab = Lab(args, work)
    rows, cpu = [], {}

    def body():
        log("lab up and deploy with the health loop on (not timed) ...")
        lab.up()
        head, workers = lab.head[0], lab.workers
        for name, _ in workers:
            sh(name, "mkdir -p %s && mount -t tmpfs -o size=320m,mode=1770 tmpfs %s" % (TMPFS, TMPFS))
        group = {"health_enabled": True, "health_interval_s": args.interval, "health_readmit_passes": args.passes,
                 "health_breaker_window_s": 0, "monitoring_alertmanager_group_wait": "1s",
                 # A new alert in a group that notified before waits group_interval (5 min by default): short here,
                 # so that the figure is the loop's and Prometheus's path, not Alertmanager's batching.
                 "monitoring_alertmanager_group_interval": "10s",
                 "monitoring_alertmanager_webhooks": ["http://127.0.0.1:%d/" % HOOK_PORT]}
        host_vars = os.path.join(lab.inventory_dir, "host_vars")
        os.makedirs(host_vars, exist_ok=True)
        worker_vars = {"ray_temp_dir": TMPFS, "ray_temp_dir_min_free_mb": 100, "health_temp_dir_min_free_mib": 128}
        for name in [head] + [name for name, _ in workers]:
            with open(os.path.join(host_vars, name + ".yml"), "w", encoding="utf-8") as fh:
                yaml.safe_dump(dict(group, **(worker_vars if name != head else {})), fh)
        with open(webhook_recorder.__file__, encoding="utf-8") as fh:
            hook = fh.read()
        sh(head, "cat > /tmp/raymetal-bench-hook.py <<'EOF'\n%s\nEOF\nrm -f %s; "
                 "systemd-run --unit raymetal-bench-hook python3 /tmp/raymetal-bench-hook.py %d %s"
           % (hook, HOOK_LOG, HOOK_PORT, HOOK_LOG))
        site(lab, "deploy")
        worker, ip = workers[0]
        for kind in ("fabric_link", "temp_dir"):
            log("%s on %s ..." % (kind, worker))
            rows.append(fault(lab, worker, ip, kind))
        log("the loop's CPU on every node over %d s ..." % args.cpu_window)
        names = [head] + [name for name, _ in workers]
        before = {name: loop_cpu_seconds(name) for name in names}
        start = time.monotonic()
        time.sleep(args.cpu_window)
        took = time.monotonic() - start
        for name in names:
            pid, seconds = loop_cpu_seconds(name)
            if pid != before[name][0]:
                raise BenchError("the health loop on %s restarted during the CPU window" % name)
            cpu[name] = 100.0 * (seconds - before[name][1]) / took

    code = guarded(body, lab.down, work, keep_logs=args.keep_logs)
    if code is not None:
        return code
    print("\nThe node health loop on a 3-node lab (interval %d s, %d passes to re-admit; load %.2f):"
          % (args.interval, args.passes, os.getloadavg()[0]))
    print("  %-12s %14s %18s %20s %14s  %s" % ("fault", "-> drained s", "-> Ray stopped s", "-> alert delivered s",
                                               "fix -> ALIVE s", "first alerts delivered"))
    for row in rows:
        print("  %-12s %14s %18.1f %20.1f %14.1f  %s" % (
            row["kind"], "not asked" if row["drained"] is None else "%.1f" % row["drained"], row["stopped"],
            row["alert"], row["alive"], ", ".join(row["alerts"])))
    worst = max(cpu.values())
    print("  the loop's CPU over %d s: %s (%% of one core); goal under 1 %%: %s"
          % (args.cpu_window, ", ".join("%s %.3f" % item for item in sorted(cpu.items())),
             "MET" if worst < 1.0 else "MISSED"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
