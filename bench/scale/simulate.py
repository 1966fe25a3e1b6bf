#!/usr/bin/env python3
"""The controller's cost of a no-op site.yml at 100, 300 and 1,000 hosts, measured on the controller alone.

A lab cannot hold 1,000 nodes, so the nodes' side is replayed: the controller does all of its own work for every
host, and only what would run on a node is answered from a recording of real nodes.

  1. A private 3-node lab (LAB_PREFIX=raysim, subnets 10.231.240.0/24 and 10.231.250.0/24 by default; not timed)
     is deployed with site.yml.
  2. Recording: site.yml runs twice more with every node's Python wrapped by a recorder that keeps, per node and
     module, what each module printed and its exit status (modules run as usual): the full path
     (-e raymetal_fast_path=false: every task on every host) and the no-op rerun as users run it (the fast path:
     the deploy's record matches, one probe per node, then the summary).
  3. For each size N, an inventory of N hosts: a head and N-1 workers, each worker standing for one of the lab's
     workers (round robin), with the lab's group_vars and the host variables of the node it stands for. Each host
     uses Ansible's local connection and, as its "Python", a stand-in that reads the module Ansible sends (the
     payload is built and shipped exactly as for a real node), and answers with the k-th answer that module gave
     on the node the host stands for. site.yml then runs as the no-op rerun of an N-node cluster, on the fast
     path for --sizes and on the full path for --full-sizes; on the full path every play,
     every task, every template and module payload for every host, every run_once over N hosts, N fabric
     addresses in every firewall table and in Prometheus's targets, forks=50 as ansible.cfg sets it.
  4. Measured per size: wall time, the controller's CPU seconds (ansible-playbook, its workers, and the stand-ins,
     whose own CPU is subtracted and shown apart), the largest process's memory (the ansible-playbook
     controller process), and from those the CPU per host and the marginal CPU per host between sizes: where
     the growth bends from linear.
  5. With --drift-sizes: the rerun after one worker drifted (issue 37, goal 5), at N hosts. Every host's probe is
     answered from the fast path's recording, one worker's with its record made stale ("differs"); every later
     module from the full path's recording. So the head and that worker take the full path, and whatever the
     deploy still runs on the N-2 hosts that match their records (today: validation and every role's read-only
     checks) is counted as it runs.

What it does not measure: SSH (the real rerun's ssh processes cost the controller about 2 ms per module
run: see the recording row, which is the same run over real SSH) and the nodes' own time, which is not the
controller's. The recording row gives the real 3-node rerun for comparison.

Usage (from the repository root; the lab image and wheelhouse built):
    .venv/bin/python bench/scale/simulate.py
    .venv/bin/python bench/scale/simulate.py --sizes 100 300 --full-sizes 100 --prefix rm16m \\
        --mgmt-subnet 10.231.74.0/24 --fabric-subnet 10.231.75.0/24
Exits 0 when every size ran, 1 on an error, 130 when interrupted.
"""

import argparse
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC = importlib.util.spec_from_file_location("deploy_bench", os.path.join(os.path.dirname(HERE), "deploy", "run.py"))
deploy_bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(deploy_bench)
BIN, REPO, BenchError, Lab = deploy_bench.BIN, deploy_bench.REPO, deploy_bench.BenchError, deploy_bench.Lab

RECORDER_PATH = "/usr/local/libexec/raymetal-bench/record-python"
RECORD_LOG = "/var/tmp/raymetal-bench-record.jsonl"

# Runs on a lab node as its Python for the recording run: runs the module with the node's python3 and keeps
# {module, rc, stdout, stderr} (one JSON line per module run).
RECORDER = r'''#!/usr/bin/python3
import json, re, subprocess, sys
payload = sys.stdin.buffer.read()
m = re.search(rb"ansible_module='([^']+)'", payload[-4096:]) or re.search(rb"ansible_module='([^']+)'", payload)
proc = subprocess.run(["/usr/bin/python3"] + sys.argv[1:], input=payload, capture_output=True)
with open("%s", "a") as fh:
    fh.write(json.dumps({"module": m.group(1).decode() if m else "?", "rc": proc.returncode,
                         "stdout": proc.stdout.decode("utf-8", "surrogateescape"),
                         "stderr": proc.stderr.decode("utf-8", "surrogateescape")}) + "\n")
sys.stdout.buffer.write(proc.stdout)
sys.stderr.buffer.write(proc.stderr)
sys.exit(proc.returncode)
''' % RECORD_LOG

# The stand-in "Python" of a simulated host (on the controller): answers each module with the recording of the
# node the host stands for, in order per module; its own CPU is logged so that it can be subtracted.
STANDIN = r'''#!%(python)s -SI
import os, re, resource, sys
if len(sys.argv) > 1 and os.path.isfile(sys.argv[1]):
    with open(sys.argv[1], "rb") as fh:  # without pipelining the module comes as a file
        payload = fh.read()
else:
    payload = sys.stdin.buffer.read()
m = re.search(rb"ansible_module='([^']+)'", payload[-4096:]) or re.search(rb"ansible_module='([^']+)'", payload)
module = m.group(1).decode() if m else "?"
alias = os.path.basename(sys.argv[0])
work = %(work)r
with open(os.path.join(work, "map", alias)) as fh:
    real = fh.read().strip()
counter = os.path.join(work, "state", alias + "." + module)
try:
    with open(counter) as fh:
        k = int(fh.read())
except OSError:
    k = 0
with open(counter, "w") as fh:
    fh.write(str(k + 1))
answers = os.path.join(work, "rec", real, module)
try:
    with open(os.path.join(answers, "%%d.out" %% k), "rb") as fh:
        out = fh.read()
    name = "%%d" %% k
except OSError:
    # More runs of this module than the node had: the last answer again (counted in the report).
    runs = sorted(int(f[:-4]) for f in os.listdir(answers) if f.endswith(".out")) if os.path.isdir(answers) else []
    with open(os.path.join(work, "beyond.log"), "a") as fh:
        fh.write("%%s %%s %%d\n" %% (alias, module, k if runs else -1))
    if runs:
        name = "%%d" %% runs[-1]
        with open(os.path.join(answers, name + ".out"), "rb") as fh:
            out = fh.read()
    else:
        # A module the node never ran (a simulated host's file differs where the real node's did not, as
        # Prometheus's target list of N hosts): "no change", as on the real node.
        name, out = None, b'{"changed": false, "msg": "simulated: no recorded answer for this module"}'
if name is None:
    rc = 0
else:
    with open(os.path.join(answers, name + ".rc")) as fh:
        rc = int(fh.read())
sys.stdout.buffer.write(out)
sys.stdout.flush()
r = resource.getrusage(resource.RUSAGE_SELF)
with open(os.path.join(work, "standin-cpu.log"), "a") as fh:
    fh.write("%%.6f\n" %% (r.ru_utime + r.ru_stime))
sys.exit(rc)
'''


# ansible-playbook, run so that its own CPU (the one process that plans every task for every host: the part
# no fork count spreads over more cores) is written down apart from its workers'.
MAIN_WRAPPER = r'''import atexit, os, resource, sys
def _own_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["RAYMETAL_BENCH_MAIN_CPU"], "w") as fh:
        fh.write("%.6f" % (r.ru_utime + r.ru_stime))
atexit.register(_own_cpu)
sys.argv = ["ansible-playbook"] + sys.argv[1:]
from ansible.cli.playbook import main
if os.environ.get("RAYMETAL_BENCH_PROFILE"):
    # --profile: the planner's own process under cProfile (its workers are forks: each one's own time is not in it).
    import cProfile, time
    # CPU time, not wall time: with forks=50 on a few cores, wall time is mostly waiting for a core.
    profiler = cProfile.Profile(time.process_time)
    atexit.register(lambda: profiler.dump_stats(os.environ["RAYMETAL_BENCH_PROFILE"]))
    # The workers are forks of this process: without this they would run under the profiler too.
    os.register_at_fork(after_in_child=profiler.disable)
    profiler.enable()
main()
'''


def log(msg):
    print("[simulate] " + msg, flush=True)


FULL_PATH = ("-e", "raymetal_fast_path=false")
FAST_PATH_SIGN = "Only the cluster summary runs"  # playbooks/fast_path.yml's message when every node matches


def planner_profile(path, keep=60):
    """{function: own seconds} of the `keep` functions with the most own time in a cProfile dump of the planner
    process (the report compares sizes on these)."""
    import pstats
    stats = pstats.Stats(path).stats
    rows = sorted(((tt, "%s:%d(%s)" % (os.path.relpath(f, REPO) if f.startswith(REPO) else
                                       f.split("site-packages/")[-1], line, name))
                   for (f, line, name), (_, _, tt, _, _) in stats.items()), reverse=True)
    return dict((name, tt) for tt, name in rows[:keep])


def run_site(inventory, logfile, env, extra=()):
    """ansible-playbook site.yml; (wall s, controller CPU s of it and its children, max RSS MB of a child, recap,
    the main process's CPU s, "fast" or "full": the path the run took)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    rss_file, main_file, wrapper = logfile + ".rss", logfile + ".main-cpu", logfile + ".main.py"
    with open(wrapper, "w", encoding="utf-8") as fh:
        fh.write(MAIN_WRAPPER)
    env = dict(env, RAYMETAL_BENCH_MAIN_CPU=main_file)
    with open(logfile, "w", encoding="utf-8") as fh:
        # /usr/bin/time: the largest resident size of ansible-playbook (and the workers it waited for).
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss_file, os.path.join(BIN, "python"), wrapper,
                               "site.yml", "-i", inventory, *extra],
                              cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(rss_file, encoding="ascii") as fh:
        rss_mb = int(fh.read().strip().splitlines()[-1]) / 1024.0
    try:
        with open(main_file, encoding="ascii") as fh:
            main_cpu = float(fh.read())
    except (OSError, ValueError):
        main_cpu = float("nan")
    with open(logfile, encoding="utf-8") as fh:
        text = fh.read()
    if proc.returncode != 0:
        raise BenchError("site.yml on %s failed (rc=%d); log %s, tail:\n%s" % (inventory, proc.returncode, logfile,
                                                                             text[-4000:]))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    _, recap = deploy_bench.parse_output(text)
    return wall, cpu, rss_mb, recap, main_cpu, "fast" if FAST_PATH_SIGN in text else "full"


def ansible_env(work):
    env = deploy_bench.ansible_env(work)
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    # The local connection pipelines too, as ansible.cfg's SSH does: one process per module run, no files.
    env["ANSIBLE_PIPELINING"] = "True"
    return env


def record(lab, work, path):
    """Install the recorder on every node, run the no-op rerun through it on `path` ("fast" or "full"), and keep
    the answers per node and module in work/rec-<path>."""
    nodes = [lab.head[0]] + [name for name, _ in lab.workers]
    for name in nodes:
        proc = subprocess.run(["docker", "exec", "-i", name, "sh", "-ec",
                               "mkdir -p %s; cat > %s; chmod 0755 %s; rm -f %s"
                               % (os.path.dirname(RECORDER_PATH), RECORDER_PATH, RECORDER_PATH, RECORD_LOG)],
                              input=RECORDER, text=True, capture_output=True, check=False)
        if proc.returncode != 0:
            raise BenchError("installing the recorder on %s failed: %s" % (name, proc.stderr))
    # One recording inventory for both paths: the fast path's probe compares the inventory (its name too) with the
    # full path's record, made with this inventory just before.
    rec_inv = os.path.join(work, "inventory-record")
    if os.path.isdir(rec_inv):
        shutil.rmtree(rec_inv)
    shutil.copytree(lab.inventory_dir, rec_inv, symlinks=True)
    with open(os.path.join(rec_inv, "hosts.yml"), encoding="utf-8") as fh:
        inv = yaml.safe_load(fh)
    for group in ("ray_head", "ray_worker"):
        for hvars in (inv["ray_cluster"]["children"][group].get("hosts") or {}).values():
            # Inventory host vars win over group_vars/ (which name /usr/bin/python3).
            hvars["ansible_python_interpreter"] = RECORDER_PATH
    with open(os.path.join(rec_inv, "hosts.yml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(inv, fh)
    logfile = os.path.join(work, "record-%s.log" % path)
    wall, cpu, rss, recap, main_cpu, took = run_site(rec_inv, logfile, ansible_env(work),
                                                     FULL_PATH if path == "full" else ())
    changed = dict((h, c["changed"]) for h, c in recap.items() if c["changed"])
    if changed:
        raise BenchError("the recorded rerun changed something (%s): not a no-op, nothing to replay" % changed)
    if took != path:
        raise BenchError("the recorded rerun took the %s path, not the %s path; log %s" % (took, path, logfile))
    counts = {}
    for name in nodes:
        proc = subprocess.run(["docker", "exec", name, "cat", RECORD_LOG], capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            raise BenchError("reading the recording on %s failed: %s" % (name, proc.stderr))
        seen = {}
        for line in proc.stdout.splitlines():
            entry = json.loads(line)
            k = seen.get(entry["module"], 0)
            seen[entry["module"]] = k + 1
            where = os.path.join(work, "rec-" + path, name, entry["module"])
            os.makedirs(where, exist_ok=True)
            with open(os.path.join(where, "%d.out" % k), "w", encoding="utf-8", errors="surrogateescape") as fh:
                fh.write(entry["stdout"])
            with open(os.path.join(where, "%d.rc" % k), "w", encoding="ascii") as fh:
                fh.write(str(entry["rc"]))
        counts[name] = sum(seen.values())
        subprocess.run(["docker", "exec", name, "rm", "-rf", os.path.dirname(RECORDER_PATH), RECORD_LOG],
                       capture_output=True, check=False)
    return {"path": path, "wall": wall, "cpu": cpu, "rss": rss, "main": main_cpu, "modules": counts}


PROBE_MODULE = "applied_state"  # the module of playbooks/fast_path.yml's probe (and of the deploy's record)
DRIFTED = "drifted"  # the recording directory suffix of the worker whose record differs
DRIFT_SIGN = "The full path runs on 2 host(s), the head and those that differ"  # playbooks/apply.yml's message


def drift_recording(work, worker):
    """work/rec-drift: for each recorded node, the full path's answers, with the fast path's probe answer first
    for the probe's module (the full path never probes: its first answer of that module is the deploy's record);
    and <worker>-drifted: the same as the recorded `worker`, its probe answer saying that its record differs."""
    fast, full, drift = (os.path.join(work, "rec-" + p) for p in ("fast", "full", "drift"))
    if os.path.isdir(drift):
        shutil.rmtree(drift)
    nodes = sorted(os.listdir(full))
    if worker not in nodes:
        raise BenchError("no recording of %s in %s" % (worker, full))
    probe_module = {}
    for node in nodes:
        shutil.copytree(os.path.join(full, node), os.path.join(drift, node))
        probes = [m for m in os.listdir(os.path.join(fast, node)) if m.endswith(PROBE_MODULE)]
        if len(probes) != 1:
            raise BenchError("the fast path's recording of %s has %d probe modules (%s), not one"
                             % (node, len(probes), probes))
        module = probe_module[node] = probes[0]
        target = os.path.join(drift, node, module)
        os.makedirs(target, exist_ok=True)
        runs = sorted((int(f[:-4]) for f in os.listdir(target) if f.endswith(".out")), reverse=True)
        for k in runs:  # the full path's answers move one place up: the probe answers first
            for ext in (".out", ".rc"):
                os.rename(os.path.join(target, "%d%s" % (k, ext)), os.path.join(target, "%d%s" % (k + 1, ext)))
        for ext in (".out", ".rc"):
            shutil.copyfile(os.path.join(fast, node, module, "0" + ext), os.path.join(target, "0" + ext))
    drifted = os.path.join(drift, "%s-%s" % (worker, DRIFTED))
    shutil.copytree(os.path.join(drift, worker), drifted)
    probe_dir = os.path.join(drifted, probe_module[worker])
    with open(os.path.join(probe_dir, "0.out"), encoding="utf-8") as fh:
        answer = json.loads(fh.read())
    if answer.get("fresh") is not True:
        raise BenchError("the fast path's recorded probe on %s did not find the node fresh: %s" % (worker, answer))
    answer.update(fresh=False, differs=["simulated drift: one watched file differs from the last deploy's record"])
    answer.pop("ansible_facts", None)  # a stale record publishes no facts (plugins/modules/applied_state.py)
    with open(os.path.join(probe_dir, "0.out"), "w", encoding="utf-8") as fh:
        fh.write(json.dumps(answer))


def simulate(lab, work, hosts, path, profile=False):
    """site.yml on `hosts` simulated hosts on `path` ("fast", "full" or "drift": the rerun after one worker
    drifted); the measurements (with the planner's profile when `profile`)."""
    sim = os.path.join(work, "sim-%s-%d" % (path, hosts))
    for sub in ("bin", "map", "state"):
        os.makedirs(os.path.join(sim, sub))
    # The recorded answers and the stand-in's logs live in the size's own directory.
    os.symlink(os.path.join(work, "rec-" + path), os.path.join(sim, "rec"))
    standin = os.path.join(sim, "standin.py")
    with open(standin, "w", encoding="utf-8") as fh:
        fh.write(STANDIN % {"python": sys.executable, "work": sim})
    os.chmod(standin, 0o755)
    with open(lab.env["LAB_INVENTORY"], encoding="utf-8") as fh:
        real = yaml.safe_load(fh)["ray_cluster"]
    real_head = real["children"]["ray_head"]["hosts"]
    real_workers = real["children"]["ray_worker"]["hosts"]
    worker_names = sorted(real_workers)

    def host_entry(alias, real_name, hvars):
        os.symlink(standin, os.path.join(sim, "bin", alias))
        with open(os.path.join(sim, "map", alias), "w", encoding="ascii") as fh:
            fh.write(real_name)
        entry = dict(hvars)
        entry.update(ansible_connection="local", ansible_become=False,
                     ansible_python_interpreter=os.path.join(sim, "bin", alias))
        return entry

    (head_name, head_vars), = real_head.items()
    heads = {"sim-head": host_entry("sim-head", head_name, head_vars)}
    workers = {}
    for i in range(1, hosts):
        real_name = worker_names[(i - 1) % len(worker_names)]
        alias = "sim-w%04d" % i
        workers[alias] = host_entry(alias, real_name, real_workers[real_name])
        if path == "drift" and i == 1:
            # The first simulated worker stands for the worker whose record differs (drift_recording).
            with open(os.path.join(sim, "map", alias), "w", encoding="ascii") as fh:
                fh.write("%s-%s" % (real_name, DRIFTED))
    inv_dir = os.path.join(sim, "inventory")
    os.makedirs(inv_dir)
    os.symlink(os.path.realpath(os.path.join(lab.inventory_dir, "group_vars")), os.path.join(inv_dir, "group_vars"))
    # The lab's token: the nodes hold it, so the token file is unchanged as in the real rerun.
    shutil.copytree(os.path.join(lab.inventory_dir, "credentials"), os.path.join(inv_dir, "credentials"))
    inventory = {"ray_cluster": {"vars": real.get("vars") or {},
                                 "children": {"ray_head": {"hosts": heads}, "ray_worker": {"hosts": workers}}}}
    with open(os.path.join(inv_dir, "hosts.yml"), "w", encoding="utf-8") as fh:
        yaml.safe_dump(inventory, fh)
    logfile = os.path.join(sim, "site.log")
    env = ansible_env(sim)
    if profile and path == "full":
        env["RAYMETAL_BENCH_PROFILE"] = os.path.join(sim, "planner.prof")
    wall, cpu, rss, recap, main_cpu, took = run_site(inv_dir, logfile, env, FULL_PATH if path == "full" else ())
    if path == "drift":
        with open(logfile, encoding="utf-8") as fh:
            if DRIFT_SIGN not in " ".join(fh.read().split()):
                raise BenchError("%d simulated hosts with one drifted worker did not take the full path on the head "
                                 "and that worker alone; log %s" % (hosts, logfile))
    elif took != path:
        raise BenchError("%d simulated hosts took the %s path, not the %s path; log %s" % (hosts, took, path, logfile))
    standin_cpu = 0.0
    runs = 0
    with open(os.path.join(sim, "standin-cpu.log"), encoding="ascii") as fh:
        for line in fh:
            standin_cpu += float(line)
            runs += 1
    beyond = 0
    if os.path.exists(os.path.join(sim, "beyond.log")):
        with open(os.path.join(sim, "beyond.log"), encoding="ascii") as fh:
            beyond = sum(1 for _ in fh)
    if len(recap) < hosts:
        raise BenchError("%d hosts simulated, but the recap names %d" % (hosts, len(recap)))
    return {"path": path, "hosts": hosts, "wall": wall, "cpu": cpu, "standin_cpu": standin_cpu, "net": cpu - standin_cpu,
            "module_runs": runs, "beyond": beyond, "rss": rss, "main": main_cpu,
            "tasks": sum(c["ok"] for h, c in recap.items() if h != "localhost"),
            "profile": planner_profile(env["RAYMETAL_BENCH_PROFILE"]) if "RAYMETAL_BENCH_PROFILE" in env else None}


GOAL_RERUN_CPU_PER_HOST = 1.0  # issue 16: controller CPU seconds per host, no-op rerun
GOAL_FULL_CPU_PER_HOST = 2.0   # issue 37, goal 3: controller CPU seconds per host, full path, at every size
GOAL_PLANNER_1000_OVER_300 = 3.6  # issue 37, goal 3: the planner's CPU at 1,000 hosts / at 300 (linear: 3.33)


def report(recordings, rows):
    print()
    print("Controller-only simulation: a no-op site.yml with N simulated hosts (nodes' answers replayed from a "
          "3-node lab), %d CPUs, forks from ansible.cfg" % (os.cpu_count() or 0))
    print()
    head = "%-5s %6s %8s %10s %10s %10s %9s %13s %9s %10s %8s" % (
        "path", "hosts", "wall s", "ctl CPU", "stand-in", "net CPU", "net/host", "marginal/host", "main CPU",
        "tasks/host", "RSS MB")
    print(head)
    print("-" * len(head))
    for path in ("fast", "full", "drift"):
        these = [r for r in rows if r["path"] == path]
        if not these:
            continue
        rec = recordings.get(path)  # none for drift: it replays both recordings
        if rec is not None:
            print("%-5s %6s %8.1f %10.1f %10s %10.1f %9.2f %13s %9.1f %10s %8.0f  (the recording: real SSH, 3 real "
                  "nodes)" % (path, "3", rec["wall"], rec["cpu"], "-", rec["cpu"], rec["cpu"] / 3, "", rec["main"], "",
                              rec["rss"]))
        prev = None
        for row in these:
            marginal = "" if prev is None else "%.3f" % ((row["net"] - prev["net"]) / (row["hosts"] - prev["hosts"]))
            print("%-5s %6d %8.1f %10.1f %10.1f %10.1f %9.3f %13s %9.1f %10.1f %8.0f" % (
                path, row["hosts"], row["wall"], row["cpu"], row["standin_cpu"], row["net"], row["net"] / row["hosts"],
                marginal, row["main"], row["tasks"] / row["hosts"], row["rss"]))
            prev = row
    print("-" * len(head))
    print("path: fast is the no-op rerun as users run it (the last deploy's record matches: one probe per node, then "
          "the summary); full is -e raymetal_fast_path=false (every task on every host: what a rerun costs after "
          "any change); drift is the rerun after one worker's record went stale (the head and that worker take the "
          "full path, every other host keeps what the last deploy applied).")
    print("ctl CPU: ansible-playbook and all its children; stand-in: the replaying stand-ins' own CPU (%s module "
          "runs), subtracted for net CPU; marginal/host: net CPU added per host from the size above; main CPU: "
          "ansible-playbook's own process (one core at most: its share bounds the wall time whatever the forks); "
          "RSS: the largest process (the controller's ansible-playbook)."
          % ", ".join("%d at %d %s" % (r["module_runs"], r["hosts"], r["path"]) for r in rows))
    if any(r["profile"] for r in rows):
        print("note: the planner ran under cProfile at %s: their wall, CPU and main CPU are higher than a plain run's"
              % ", ".join("%d hosts (%s)" % (r["hosts"], r["path"]) for r in rows if r["profile"]))
    if any(r["beyond"] for r in rows):
        print("note: %s module runs went beyond what the recorded node ran and were answered with its last answer"
              % ", ".join("%d at %d hosts (%s)" % (r["beyond"], r["hosts"], r["path"]) for r in rows if r["beyond"]))
    for path in ("fast", "full"):
        these = [r for r in rows if r["path"] == path]
        if len(these) >= 2:
            first, last = these[0], these[-1]
            print("%s path, from %d to %d hosts: %.2fx the CPU for %.1fx the hosts; per-host CPU at %d / at %d "
                  "hosts: %.2f (1.00 = linear; above 1 it bends upward)"
                  % (path, first["hosts"], last["hosts"], last["net"] / first["net"], last["hosts"] / first["hosts"],
                     last["hosts"], first["hosts"], (last["net"] / first["net"]) / (last["hosts"] / first["hosts"])))
    for path in ("fast", "full"):
        these = [r for r in rows if r["path"] == path and r["profile"]]
        if len(these) < 2:
            continue
        small, large = these[0], these[-1]
        ratio = large["hosts"] / small["hosts"]
        print()
        print("The planner's profile, %s path (cProfile, own CPU time of each function in ansible-playbook's process; "
              "it slows that process, so its CPU above is not the plain figure): the functions whose time grew "
              "most from %d to %d hosts, %.1fx the hosts (%.1fx = linear, %.1fx = square)"
              % (path, small["hosts"], large["hosts"], ratio, ratio, ratio * ratio))
        grown = sorted(((large["profile"][name] - small["profile"].get(name, 0.0), name) for name in large["profile"]),
                       reverse=True)[:15]
        print("  %10s %10s %7s  %s" % ("s at %d" % small["hosts"], "s at %d" % large["hosts"], "growth", "function"))
        for _, name in grown:
            before = small["profile"].get(name)
            print("  %10s %10.1f %7s  %s" % ("%.1f" % before if before is not None else "<top", large["profile"][name],
                                             "%.1fx" % (large["profile"][name] / before) if before else "", name))
    print()
    print("Goals (issue 16), on the no-op rerun as users run it (the fast path):")
    for row in rows:
        if row["path"] != "fast":
            continue
        per_host = row["net"] / row["hosts"]
        print("  controller CPU per host at %4d hosts: %.3f s  goal <= %.1f s: %s"
              % (row["hosts"], per_host, GOAL_RERUN_CPU_PER_HOST,
                 "MET" if per_host <= GOAL_RERUN_CPU_PER_HOST else "MISSED"))
    full = dict((r["hosts"], r) for r in rows if r["path"] == "full")
    print("Goals (issue 37, goal 3), on the full path (-e raymetal_fast_path=false):")
    if not full:
        print("  not measured (--full-sizes is empty)")
    for hosts, row in sorted(full.items()):
        per_host = row["net"] / row["hosts"]
        print("  controller CPU per host at %4d hosts: %.2f s  goal <= %.1f s: %s"
              % (hosts, per_host, GOAL_FULL_CPU_PER_HOST, "MET" if per_host <= GOAL_FULL_CPU_PER_HOST else "MISSED"))
    if 300 in full and 1000 in full:
        ratio = full[1000]["main"] / full[300]["main"]
        print("  the planner's CPU (ansible-playbook's own process) at 1,000 / at 300 hosts: %.1f s / %.1f s = %.2fx  "
              "goal <= %.1fx (linear: 3.33x): %s" % (full[1000]["main"], full[300]["main"], ratio,
                                                     GOAL_PLANNER_1000_OVER_300,
                                                     "MET" if ratio <= GOAL_PLANNER_1000_OVER_300 else "MISSED"))
    elif full:
        print("  the planner at 1,000 / at 300 hosts: not measured (needs --full-sizes 300 1000)")
    print("Goals (issue 37, goal 5), one drifted worker: at most the no-op's controller CPU at the same size plus 2x one "
          "host's full path (the full path's net CPU per host at the largest --full-sizes):")
    fast = dict((r["hosts"], r) for r in rows if r["path"] == "fast")
    drift = dict((r["hosts"], r) for r in rows if r["path"] == "drift")
    if not drift:
        print("  not measured (--drift-sizes is empty)")
    for hosts, row in sorted(drift.items()):
        if hosts not in fast or not full:
            print("  %4d hosts: %.1f s net controller CPU; goal not judged (needs --sizes %d and a --full-sizes run)"
                  % (hosts, row["net"], hosts))
            continue
        per_host_full = full[max(full)]["net"] / max(full)
        goal = fast[hosts]["net"] + 2 * per_host_full
        print("  %4d hosts: %.1f s  goal <= %.1f s (no-op %.1f + 2 x %.2f): %s; %.1f tasks per host ran (no-op: %.1f)"
              % (hosts, row["net"], goal, fast[hosts]["net"], per_host_full, "MET" if row["net"] <= goal else "MISSED",
                 row["tasks"] / hosts, fast[hosts]["tasks"] / hosts))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100, 300, 1000],
                        help="simulated hosts for the no-op rerun as users run it, the fast path (default 100 300 1000)")
    parser.add_argument("--full-sizes", type=int, nargs="*", default=[100],
                        help="simulated hosts for the full path, -e raymetal_fast_path=false (default 100; 300 takes "
                             "about half an hour of a 2-CPU machine)")
    parser.add_argument("--drift-sizes", type=int, nargs="*", default=[],
                        help="simulated hosts for the rerun after one worker drifted (issue 37, goal 5, judged at "
                             "1000; none by default: while every host still runs validation and the checks, 1000 "
                             "takes about as long as the full path at 300); needs the same size in --sizes to judge")
    parser.add_argument("--prefix", default="raysim", help="LAB_PREFIX of the lab whose nodes are recorded")
    parser.add_argument("--mgmt-subnet", default="10.231.240.0/24")
    parser.add_argument("--fabric-subnet", default="10.231.250.0/24")
    parser.add_argument("--keep-logs", action="store_true", help="keep the work dir after a successful run")
    parser.add_argument("--profile", action="store_true",
                        help="run the planner (ansible-playbook's own process, not its workers) under cProfile at every "
                             "full-path size and print the functions whose time grows fastest with the hosts; the "
                             "fast-path sizes run without it")
    args = parser.parse_args()
    if args.prefix == "raymetal":
        sys.exit("--prefix raymetal is the main lab's; the simulation needs a lab of its own")
    args.sizes = sorted(set(args.sizes))
    args.full_sizes = sorted(set(args.full_sizes))
    args.drift_sizes = sorted(set(args.drift_sizes))
    if not args.sizes and not args.full_sizes and not args.drift_sizes:
        sys.exit("--sizes, --full-sizes and --drift-sizes are all empty: nothing to simulate")
    if min(args.sizes + args.full_sizes + args.drift_sizes) < 2:
        sys.exit("--sizes, --full-sizes, --drift-sizes: at least 2 hosts (a head and a worker)")
    if args.drift_sizes and min(args.drift_sizes) < 3:
        sys.exit("--drift-sizes: at least 3 hosts (a head, the drifted worker and one that matches its record)")

    def on_term(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)

    work = tempfile.mkdtemp(prefix="raymetal-simulate-")
    lab = Lab(argparse.Namespace(prefix=args.prefix, mgmt_subnet=args.mgmt_subnet, fabric_subnet=args.fabric_subnet,
                                 workers=2), work)
    log("work dir %s; sizes %s (fast path), %s (full path), %s (one drifted worker); %s" % (
        work, " ".join(map(str, args.sizes)) or "none", " ".join(map(str, args.full_sizes)) or "none",
        " ".join(map(str, args.drift_sizes)) or "none", deploy_bench.load()))
    rows, recordings = [], {}
    plan = [("full", args.full_sizes), ("fast", args.sizes), ("drift", args.drift_sizes)]
    # The full path's recording always (the fast path's recording matches the record it leaves), the fast path's
    # when a fast-path or drift size replays it (the drift run replays both).
    record_paths = ["full", "fast"] if args.sizes or args.drift_sizes else ["full"]

    def sizes():
        if lab.leftovers():
            lab.down()
        log("3-node lab up and deployed (not timed)")
        lab.up()
        run_site(lab.inventory_dir, os.path.join(work, "deploy.log"), ansible_env(work))
        # The full path first, always: it ends by recording the deploy again with the recording's inventory (the
        # nodes' Python wrapped), which the fast path's recording then matches.
        for path in record_paths:
            log("recording the no-op rerun on the real nodes, %s path" % path)
            rec = recordings[path] = record(lab, work, path)
            log("recorded (%s path): %.1f s, %.1f controller CPU s; module runs per node %s"
                % (path, rec["wall"], rec["cpu"], rec["modules"]))
        if args.drift_sizes:
            with open(lab.env["LAB_INVENTORY"], encoding="utf-8") as fh:
                real_workers = yaml.safe_load(fh)["ray_cluster"]["children"]["ray_worker"]["hosts"]
            drift_recording(work, sorted(real_workers)[0])
        for path, path_sizes in plan:
            for hosts in path_sizes:
                log("%d simulated hosts, %s path: %s" % (hosts, path, deploy_bench.load()))
                row = simulate(lab, work, hosts, path, args.profile)
                rows.append(row)
                log("%d hosts, %s path: %.1f s wall, %.1f controller CPU s (%.1f of it the stand-ins), %.0f MB"
                    % (hosts, path, row["wall"], row["cpu"], row["standin_cpu"], row["rss"]))

    rc = deploy_bench.guarded(sizes, lab.down, work, args.keep_logs)
    if rc is not None:
        return rc
    report(recordings, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
