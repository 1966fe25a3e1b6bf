#!/usr/bin/env python3
"""Time a fresh raymetal deploy against a hand-made floor and a no-op rerun, in one run.

Phases, each on brand-new containers of a private lab (LAB_PREFIX=raybench,
1 head + 2 workers, subnets 10.231.180.0/24 and 10.231.190.0/24 by default):

  floor 1   the same end state by hand, with `docker exec`/`docker cp` and no Ansible:
            copy the wheelhouse (Ray + NCCL) into every node, `python3 -m venv` and one
            offline `pip install` of ray[default] and the NCCL wheel on every node (in
            parallel), the head's `ray start --head --block` under a transient systemd
            unit with token auth and the deploy's pinned ports, the workers' joins, until
            the dashboard API (with the token) reports 3 ALIVE nodes
  deploy    `ansible-playbook site.yml -i <bench inventory>` until it ends (site.yml waits
            for every node and prints the cluster summary)
  rerun     the same command again on the deployed lab: the no-op rerun
  baseline  with --baseline REV: the deploy and rerun of REV's tree (git archive of REV, its own
            ansible.cfg and inventory/lab/group_vars) on another fresh lab, so that "no slower
            than before" is measured in the same run as the current tree
  floor 2   the floor again (skip with --single-floor): floors on both sides of the deploy,
            so a load swing on this shared machine hits both measurements

The lab is created with lab/lab.sh before each phase (not timed) and removed after it,
and always at the end, also on an error or Ctrl-C.

Usage (from the repository root):
    .venv/bin/python bench/deploy/run.py
    .venv/bin/python bench/deploy/run.py --single-floor --top 15
    .venv/bin/python bench/deploy/run.py --baseline 4d9246c --strategy linear -e monitoring_enabled=false

The lab inventory runs the monitoring and the node health loop (health_enabled), which the floor does
not install: `-e monitoring_enabled=false -e health_enabled=false` compares like with like.

Exits 0 when every phase ran (targets MET or MISSED are printed, not turned into an exit
status), 1 on an error, 130 when interrupted.
"""

import argparse
import concurrent.futures
import json
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
LAB_SH = os.path.join(REPO, "lab", "lab.sh")
CACHE = os.environ.get("RAYMETAL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "raymetal")

# What the floor installs and how Ray runs: the lab inventory's values (inventory/lab/group_vars)
# and the ray role's defaults (roles/ray/defaults/main.yml, templates/ray.service.j2).
RAY_SPEC = "ray[default]==2.60.0"
# --baseline: "no slower than before" allows for this shared machine's run-to-run noise
# (5-10 s on a 60-70 s deploy, about 1 s on a 13 s rerun; README's results).
TARGET_BASELINE = 1.10
NCCL_SPEC = "nvidia-nccl-cu12==2.32.3"
NODE_WH = "/var/cache/raymetal/wheelhouse"
VENV = "/opt/ray/venv"
TOKEN_PATH = "/etc/ray/auth_token"
TEMP_DIR = "/var/lib/ray/tmp"
GCS_PORT = 6379
DASHBOARD_PORT = 8265
COMMON_FLAGS = [
    "--node-manager-port=6380", "--object-manager-port=6381", "--runtime-env-agent-port=6382",
    "--dashboard-agent-listen-port=52365", "--dashboard-agent-grpc-port=6383",
    "--metrics-export-port=6384", "--min-worker-port=10002", "--max-worker-port=19999",
    "--num-cpus=2", "--num-gpus=0", "--object-store-memory=268435456",
    "--temp-dir=" + TEMP_DIR, "--disable-usage-stats", "--log-style=record",
]
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": TOKEN_PATH, "RAY_USAGE_STATS_ENABLED": "0"}

TARGET_RATIO = 1.5
TARGET_RERUN_S = 15.0

# profile_tasks recap line: "<task name> ------------ 12.34s"
PROFILE_LINE = re.compile(r"^(?P<task>\S.*?)\s-{3,}\s+(?P<secs>\d+(?:\.\d+)?)s\s*$")
RECAP_LINE = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
                        r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)")


class BenchError(Exception):
    """A phase failed: the benchmark has no figure to report."""


def log(msg):
    print("[bench] " + msg, flush=True)


def load():
    one, five, fifteen = os.getloadavg()
    return "load average %.2f %.2f %.2f (%d CPUs)" % (one, five, fifteen, os.cpu_count() or 0)


def run(cmd, what, env=None, logfile=None, timeout=None):
    """Run cmd; raise BenchError naming `what` and the output tail when it fails."""
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=timeout)
    if logfile:
        with open(logfile, "a", encoding="utf-8") as fh:
            fh.write("$ %s\n%s%s\n" % (" ".join(cmd), proc.stdout, proc.stderr))
    if proc.returncode != 0:
        raise BenchError("%s failed (rc=%d): %s\n%s%s" % (what, proc.returncode, " ".join(cmd[:6]),
                                                          proc.stdout[-3000:], proc.stderr[-3000:]))
    return proc


class Lab:
    """The bench's own lab: lab/lab.sh with a private prefix, subnets, state and inventory."""

    def __init__(self, args, work):
        self.work = work
        self.inventory_dir = os.path.join(work, "inventory")
        self.state = os.path.join(work, "state")
        self.env = dict(os.environ, LAB_PREFIX=args.prefix, LAB_MGMT_SUBNET=args.mgmt_subnet,
                        LAB_FABRIC_SUBNET=args.fabric_subnet, LAB_STATE=self.state,
                        LAB_WORKERS=str(getattr(args, "workers", 2)),
                        LAB_INVENTORY=os.path.join(self.inventory_dir, "hosts.yml"))
        # Nodes as a site's: without the lab's bytecode cache of Ansible's module payloads
        # (lab/files/raymetal_lab_bytecode.py), which would make the nodes' CPU figures a third lower.
        self.env.setdefault("LAB_BYTECODE_CACHE", "0")
        if "LAB_IMAGE" not in os.environ:
            # The main lab's image (raymetal-node:<tag>): with another LAB_PREFIX, lab.sh would
            # otherwise debootstrap a second, identical image named after the prefix.
            main_env = dict(((k, v) for k, v in os.environ.items() if k != "LAB_PREFIX"),
                            LAB_BYTECODE_CACHE=self.env["LAB_BYTECODE_CACHE"])
            self.env["LAB_IMAGE"] = run(["bash", LAB_SH, "image-name"], "lab.sh image-name",
                                        env=main_env).stdout.strip()
        self.prefix = args.prefix
        self.logfile = os.path.join(work, "lab.log")
        self.write_group_vars(REPO, self.inventory_dir)

    def write_group_vars(self, root, inventory_dir):
        """root's inventory/lab/group_vars in inventory_dir.

        The SSH key comes from the hosts.yml that lab.sh writes; an older tree whose
        group_vars name the built-in lab's key gets this lab's key there instead.
        """
        src = os.path.join(root, "inventory", "lab", "group_vars")
        dst = os.path.join(inventory_dir, "group_vars")
        shutil.copytree(src, dst)
        key = "{{ inventory_dir }}/../../lab/.state/id_ed25519"
        for name in os.listdir(dst):
            path = os.path.join(dst, name)
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            if key in text:
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(text.replace(key, os.path.join(self.state, "id_ed25519")))

    def up(self):
        start = time.monotonic()
        run(["bash", LAB_SH, "up"], "lab up", env=self.env, logfile=self.logfile)
        took = time.monotonic() - start
        with open(self.env["LAB_INVENTORY"], encoding="utf-8") as fh:
            inv = yaml.safe_load(fh)
        groups = inv["ray_cluster"]["children"]
        head = list(groups["ray_head"]["hosts"].items())
        workers = list((groups["ray_worker"].get("hosts") or {}).items())
        expected = int(self.env["LAB_WORKERS"])
        if len(head) != 1 or len(workers) != expected:
            raise BenchError("the bench lab should have 1 head and %d workers, got %s" % (expected, inv))
        self.head = (head[0][0], head[0][1]["lab_fabric_ip"])
        self.workers = [(name, hv["lab_fabric_ip"]) for name, hv in workers]
        names = [self.head[0]] + [name for name, _ in self.workers]
        proc = run(["docker", "inspect", "-f", "{{.Id}}"] + names, "docker inspect")
        self.ids = proc.stdout.split()
        return took

    def inventory_of(self, root, name):
        """An inventory for another tree (root): its own group_vars, this lab's hosts.yml."""
        inventory_dir = os.path.join(self.work, name)
        if not os.path.isdir(inventory_dir):
            self.write_group_vars(root, inventory_dir)
        shutil.copy(self.env["LAB_INVENTORY"], os.path.join(inventory_dir, "hosts.yml"))
        return inventory_dir

    def cpu_seconds(self):
        """CPU time used so far by everything in the lab's containers (their cgroups), or None."""
        return containers_cpu_seconds(self.ids)

    def down(self):
        subprocess.run(["bash", LAB_SH, "down"], cwd=REPO, env=self.env, capture_output=True, check=False)

    def leftovers(self):
        proc = subprocess.run(["docker", "ps", "-aq", "--filter", "label=io.raymetal.lab=" + self.prefix],
                              capture_output=True, text=True, check=False)
        return proc.stdout.split()


def containers_cpu_seconds(ids):
    """CPU time used so far by the containers with these IDs (their cgroups, v1 or v2), or None when one of
    them has no cgroup this can read."""
    total = 0.0
    for cid in ids:
        v1 = "/sys/fs/cgroup/cpuacct/docker/%s/cpuacct.usage" % cid
        v2 = ["/sys/fs/cgroup/system.slice/docker-%s.scope/cpu.stat" % cid,
              "/sys/fs/cgroup/docker/%s/cpu.stat" % cid]
        if os.path.exists(v1):
            with open(v1, encoding="ascii") as fh:
                total += int(fh.read()) / 1e9
            continue
        for path in v2:
            if os.path.exists(path):
                with open(path, encoding="ascii") as fh:
                    stat = dict(line.split() for line in fh if line.strip())
                total += int(stat["usage_usec"]) / 1e6
                break
        else:
            return None
    return total


def dexec(node, script, what, logfile):
    cmd = ["docker", "exec", node, "sh", "-ec", script]
    return run(cmd, "%s on %s" % (what, node), logfile=logfile)


def parallel(fn, items):
    """fn(item) for every item at once; the first failure is raised after all ended."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(items))
    futures = [pool.submit(fn, item) for item in items]
    try:
        return [f.result() for f in futures]
    finally:
        # On Ctrl-C, do not wait here: the teardown removes the containers, which ends the
        # `docker exec` commands the threads are waiting on.
        pool.shutdown(wait=False, cancel_futures=True)


def wait_port(host, port, timeout):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError as err:
            if time.monotonic() > deadline:
                raise BenchError("%s:%d not reachable after %d s: %s" % (host, port, timeout, err)) from err
        time.sleep(0.1)


def wait_alive(base, token, wanted, timeout):
    """Poll the dashboard's node list (with the token) until `wanted` nodes are ALIVE."""
    deadline = time.monotonic() + timeout
    req = urllib.request.Request(base + "/api/v0/nodes?detail=true", headers={"Authorization": "Bearer " + token})
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                payload = json.loads(resp.read())
            nodes = payload["data"]["result"]["result"]
            alive = [n for n in nodes if n.get("state") == "ALIVE"]
            if len(alive) >= wanted:
                return
            last = "%d of %d nodes ALIVE" % (len(alive), wanted)
        except (OSError, ValueError, KeyError, TypeError) as err:
            last = str(err)
        time.sleep(0.25)
    raise BenchError("the floor's cluster did not reach %d ALIVE nodes in %d s: %s" % (wanted, timeout, last))


def floor(lab, label):
    """Deploy by hand with docker exec; return {step: seconds} with 'total'."""
    logfile = os.path.join(lab.work, label + ".log")
    nodes = [lab.head] + lab.workers
    token = secrets.token_hex(32)
    steps = {}
    start = time.monotonic()

    def copy(node):
        name = node[0]
        dexec(name, "mkdir -p %s" % NODE_WH, "mkdir", logfile)
        run(["docker", "cp", os.path.join(CACHE, "wheelhouse") + "/.", "%s:%s" % (name, NODE_WH)],
            "docker cp wheelhouse to " + name, logfile=logfile)

    parallel(copy, nodes)
    steps["copy wheelhouses"] = time.monotonic() - start

    t = time.monotonic()
    install = ("python3 -m venv {venv}\nPIP_CONFIG_FILE=/dev/null {venv}/bin/pip install -q "
               "--disable-pip-version-check --no-index --find-links {wh} '{ray}' '{nccl}'").format(
                   venv=VENV, wh=NODE_WH, ray=RAY_SPEC, nccl=NCCL_SPEC)
    parallel(lambda node: dexec(node[0], install, "venv + pip install", logfile), nodes)
    steps["venv + pip install"] = time.monotonic() - t

    t = time.monotonic()
    setenv = [arg for key, value in sorted(RAY_ENV.items()) for arg in ("--setenv", "%s=%s" % (key, value))]

    def start_ray(node, unit, flags):
        name, ip = node
        # The token goes in on stdin: never on a command line.
        proc = subprocess.run(["docker", "exec", "-i", name, "sh", "-ec",
                               "umask 077; mkdir -p /etc/ray %s; cat > %s" % (TEMP_DIR, TOKEN_PATH)],
                              input=token + "\n", capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BenchError("writing the token on %s failed: %s" % (name, proc.stderr))
        cmd = (["docker", "exec", name, "systemd-run", "--unit=" + unit, "--collect", "--quiet"] + setenv
               + [VENV + "/bin/ray", "start", "--block", "--node-ip-address=" + ip] + flags + COMMON_FLAGS)
        run(cmd, "starting %s on %s" % (unit, name), logfile=logfile)

    head_ip = lab.head[1]
    start_ray(lab.head, "raybench-floor-head",
              ["--head", "--port=%d" % GCS_PORT, "--dashboard-host=" + head_ip,
               "--dashboard-port=%d" % DASHBOARD_PORT, "--ray-client-server-port=10001"])
    # The deploy's workers wait for the head's GCS port (ray-wait-for-head); so does the floor.
    wait_port(head_ip, GCS_PORT, 120)
    steps["head start (GCS port open)"] = time.monotonic() - t

    t = time.monotonic()
    parallel(lambda node: start_ray(node, "raybench-floor-worker", ["--address=%s:%d" % (head_ip, GCS_PORT)]),
             lab.workers)
    wait_alive("http://%s:%d" % (head_ip, DASHBOARD_PORT), token, len(nodes), 180)
    steps["worker joins (3 ALIVE)"] = time.monotonic() - t
    steps["total"] = time.monotonic() - start
    return steps


def strategy_in_use(chosen=None):
    """The strategy the runs use: the one chosen for the bench, else ANSIBLE_STRATEGY, else ansible.cfg's."""
    return chosen or os.environ.get("ANSIBLE_STRATEGY", "each tree's ansible.cfg")


def ansible_env(work, root=REPO, strategy=None):
    # The tree's ansible.cfg as users run it (no persistent fact cache), with profile_tasks
    # switched on (opt-in since the default output stays machine-readable) and SSH control
    # sockets of the bench's own: nothing stale from other labs. --strategy sets one strategy
    # for every run, so that two trees are compared and not two strategies.
    cp_dir = os.path.join(work, "cp")
    os.makedirs(cp_dir, exist_ok=True)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(root, "ansible.cfg"),
               ANSIBLE_SSH_CONTROL_PATH_DIR=cp_dir, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
               PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    if strategy:
        env["ANSIBLE_STRATEGY"] = strategy
    return env


def site(lab, label, root=REPO, inventory=None, extra_vars=(), strategy=None):
    """Run root's site.yml on the bench inventory; return (seconds, profile [(task, s)], recap {host: counts})."""
    logfile = os.path.join(lab.work, label + ".log")
    cmd = [os.path.join(BIN, "ansible-playbook"), "site.yml", "-i", inventory or lab.inventory_dir]
    for extra in extra_vars:
        cmd += ["-e", extra]
    start = time.monotonic()
    with open(logfile, "w", encoding="utf-8") as fh:
        proc = subprocess.run(cmd, cwd=root, env=ansible_env(lab.work, root, strategy), stdout=fh,
                              stderr=subprocess.STDOUT, check=False)
    took = time.monotonic() - start
    with open(logfile, encoding="utf-8") as fh:
        text = fh.read()
    if proc.returncode != 0:
        raise BenchError("%s: ansible-playbook site.yml failed (rc=%d); log %s, tail:\n%s"
                         % (label, proc.returncode, logfile, text[-4000:]))
    profile, recap = parse_output(text)
    return took, profile, recap


def parse_output(text):
    """profile_tasks' recap (after the last ===== rule) and the PLAY RECAP counts."""
    profile, recap = [], {}
    lines = text.splitlines()
    rule = max((i for i, line in enumerate(lines) if re.fullmatch(r"={20,}", line.strip())), default=None)
    if rule is not None:
        for line in lines[rule + 1:]:
            m = PROFILE_LINE.match(line)
            if m:
                profile.append((m.group("task"), float(m.group("secs"))))
    for line in lines:
        m = RECAP_LINE.match(line)
        if m:
            recap[m.group("host")] = dict((k, int(m.group(k))) for k in ("ok", "changed", "unreachable", "failed"))
    return profile, recap


def controller_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measured(lab, phase, fn):
    """Run fn(); return (its result, {wall, node_cpu, controller_cpu, load_before, load_after})."""
    log("%s: %s" % (phase, load()))
    load_before, node0, ctl0 = os.getloadavg()[0], lab.cpu_seconds(), controller_cpu()
    start = time.monotonic()
    result = fn()
    wall = time.monotonic() - start
    node1 = lab.cpu_seconds()
    return result, {"wall": wall, "node_cpu": None if node0 is None or node1 is None else node1 - node0,
                    "controller_cpu": controller_cpu() - ctl0, "load_before": load_before,
                    "load_after": os.getloadavg()[0]}


def verdict(ok):
    return "MET" if ok else "MISSED"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prefix", default="raybench", help="LAB_PREFIX of the bench lab (default raybench)")
    parser.add_argument("--mgmt-subnet", default="10.231.180.0/24")
    parser.add_argument("--fabric-subnet", default="10.231.190.0/24")
    parser.add_argument("--single-floor", action="store_true",
                        help="measure the floor once, before the deploy (default: before and after)")
    parser.add_argument("--top", type=int, default=10, help="how many of the slowest tasks to list")
    parser.add_argument("--keep-logs", action="store_true", help="keep the work dir (logs) after a successful run")
    parser.add_argument("--baseline", metavar="REV",
                        help="also deploy and rerun the tree of this git revision (its ansible.cfg and lab "
                             "group_vars), on a fresh lab of its own, and compare")
    parser.add_argument("--strategy", help="ANSIBLE_STRATEGY for every run of every tree (e.g. linear)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                        help="extra vars for the current tree's runs (not the baseline's), e.g. "
                             "monitoring_enabled=false to leave out what the baseline did not have")
    args = parser.parse_args()
    if args.prefix == "raymetal":
        sys.exit("--prefix raymetal is the main lab's; the bench needs a lab of its own")

    def on_term(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)

    work = tempfile.mkdtemp(prefix="raybench-deploy-")
    lab = Lab(args, work)
    log("node image %s, work dir %s" % (lab.env.get("LAB_IMAGE", "(lab.sh default)"), work))
    log("Ansible strategy: %s" % strategy_in_use(args.strategy))
    baseline_root = None
    if args.baseline:
        baseline_root = os.path.join(work, "baseline-tree")
        os.makedirs(baseline_root)
        archive = subprocess.run(["git", "-C", REPO, "archive", args.baseline], capture_output=True, check=False)
        if archive.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            sys.exit("--baseline %s: git archive failed: %s" % (args.baseline, archive.stderr.decode().strip()))
        subprocess.run(["tar", "-x", "-C", baseline_root], input=archive.stdout, check=True)
        log("baseline: the tree of %s in %s" % (args.baseline, baseline_root))
    if lab.leftovers():
        log("removing a %s lab left from an earlier run" % args.prefix)
        lab.down()
    floors, results, lab_up = [], {}, []

    def phases():
        order = ["floor 1", "deploy"] + (["baseline"] if baseline_root else []) + (
            [] if args.single_floor else ["floor 2"])
        for phase in order:
            log("%s: bringing up a fresh %s lab (not timed)" % (phase, args.prefix))
            lab_up.append(lab.up())
            if phase.startswith("floor"):
                steps, m = measured(lab, phase, lambda p=phase: floor(lab, p.replace(" ", "")))
                floors.append((phase, steps, m))
                log("%s: %.1f s (%s)" % (phase, m["wall"], ", ".join(
                    "%s %.1f s" % (k, v) for k, v in steps.items() if k != "total")))
            elif phase == "baseline":
                inventory = lab.inventory_of(baseline_root, "inventory-baseline")
                for label in ("baseline deploy", "baseline rerun"):
                    (_, profile, recap), m = measured(lab, label, lambda lb=label: site(
                        lab, lb.replace(" ", "-"), baseline_root, inventory, strategy=args.strategy))
                    results[label] = (profile, recap, m)
                    log("%s: %.1f s; %s" % (label, m["wall"], recap))
            else:
                for label in ("deploy", "rerun"):
                    (_, profile, recap), m = measured(lab, label, lambda lb=label: site(
                        lab, lb, extra_vars=args.extra_vars, strategy=args.strategy))
                    results[label] = (profile, recap, m)
                    log("%s: %.1f s; %s" % (label, m["wall"], recap))
            lab.down()

    def tear_down():
        log("tearing the %s lab down" % args.prefix)
        lab.down()

    rc = guarded(phases, tear_down, work, args.keep_logs)
    if rc is not None:
        return rc
    report(args, floors, results, lab_up)
    return 0


def guarded(body, cleanup, work, keep_logs=False):
    """Run a bench's body(): on a BenchError or an interrupt say why and return 1 or 130 (None when it ran to the
    end). cleanup() runs in any case (the lab comes down); the work dir's logs are kept after a failure or with
    keep_logs, and removed otherwise. bench/scale's scripts use it too."""
    failed = True
    try:
        body()
        failed = False
        return None
    except BenchError as err:
        print("ERROR: %s" % err, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        cleanup()
        if failed or keep_logs:
            log("logs kept in %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def fmt(value, spec="%.1f"):
    return "n/a" if value is None else spec % value


def report(args, floors, results, lab_up):
    deploy_profile, _, deploy = results["deploy"]
    rerun_profile, rerun_recap, rerun = results["rerun"]
    floor_walls = [m["wall"] for _, _, m in floors]
    floor_s = statistics.mean(floor_walls)
    ratio = deploy["wall"] / floor_s
    print()
    print("Deploy benchmark: lab %s, 1 head + 2 workers, %s + %s, controller with %d CPUs" % (
        args.prefix, RAY_SPEC, NCCL_SPEC, os.cpu_count() or 0))
    print("(lab up before each phase, not timed: %s)" % ", ".join("%.1f s" % t for t in lab_up))
    print()
    head = "%-42s %8s %9s %9s %12s" % ("Phase", "wall s", "node CPU", "ctl CPU", "load 1m b/a")
    print(head)
    print("-" * len(head))

    def row(title, m):
        print("%-42s %8.1f %9s %9s %5.1f/%-5.1f" % (title, m["wall"], fmt(m["node_cpu"]), fmt(m["controller_cpu"]),
                                                    m["load_before"], m["load_after"]))
    for phase, steps, m in floors:
        row(phase + ": floor by hand (docker exec)", m)
        for step, secs in steps.items():
            if step != "total":
                print("    %-38s %8.1f" % (step, secs))
    row("fresh deploy: ansible-playbook site.yml", deploy)
    row("no-op rerun: ansible-playbook site.yml", rerun)
    if "baseline deploy" in results:
        row("fresh deploy: the tree of %s" % args.baseline, results["baseline deploy"][2])
        row("no-op rerun: the tree of %s" % args.baseline, results["baseline rerun"][2])
    print("-" * len(head))
    print("node CPU: CPU seconds used inside the 3 containers (cgroup cpuacct); ctl CPU: by this script's")
    print("children on the controller (docker CLI, ansible-playbook, ssh, rsync; not dockerd's docker cp).")
    print()
    if len(floor_walls) > 1:
        print("floor: mean %.1f s of %s" % (floor_s, ", ".join("%.1f s" % w for w in floor_walls)))
    print("fresh deploy / floor (wall): %.2fx  (to the fastest floor: %.2fx)  target <= %.1fx: %s"
          % (ratio, deploy["wall"] / min(floor_walls), TARGET_RATIO, verdict(ratio <= TARGET_RATIO)))
    floor_cpu = [m["node_cpu"] + m["controller_cpu"] for _, _, m in floors if m["node_cpu"] is not None]
    if floor_cpu and deploy["node_cpu"] is not None:
        print("fresh deploy / floor (CPU seconds, nodes + controller, less load-sensitive): %.2fx"
              % ((deploy["node_cpu"] + deploy["controller_cpu"]) / statistics.mean(floor_cpu)))
    print("no-op rerun: %.1f s  target < %.0f s: %s" % (rerun["wall"], TARGET_RERUN_S,
                                                        verdict(rerun["wall"] < TARGET_RERUN_S)))
    changed = dict((h, c["changed"]) for h, c in rerun_recap.items() if c["changed"])
    print("no-op rerun changed: %s" % (changed or "0 on every host"))
    if "baseline deploy" in results:
        print()
        print("Against the baseline %s (same lab image, wheelhouse and strategy: %s; current tree's extra vars: %s):"
              % (args.baseline, args.strategy or "each tree's ansible.cfg", " ".join(args.extra_vars) or "none"))
        for label, mine in (("fresh deploy", deploy), ("no-op rerun", rerun)):
            base = results["baseline " + label.split()[-1]][2]
            ratio_b = mine["wall"] / base["wall"]
            print("  %-13s now %6.1f s, baseline %6.1f s: %.2fx  no slower (<= %.2fx, this machine's run-to-run "
                  "noise): %s" % (label, mine["wall"], base["wall"], ratio_b, TARGET_BASELINE,
                                  verdict(ratio_b <= TARGET_BASELINE)))
    for title, profile in (("no-op rerun", rerun_profile), ("fresh deploy", deploy_profile)):
        print()
        print("Slowest tasks of the %s (profile_tasks: wall time of each task, all hosts):" % title)
        if not profile:
            print("  (no profile_tasks output found)")
        for task, secs in profile[:args.top]:
            print("  %7.2f s  %s" % (secs, task))
    print()
    print("The floor includes: docker cp of the wheelhouse (Ray and its dependencies 108 MB, NCCL 351 MB) into each node, "
          "python3 -m venv and ONE offline pip install of %s and %s per node, token file, head and worker "
          "`ray start --block` as root under transient systemd units with the deploy's pinned ports, "
          "polling the dashboard (token) until 3 nodes are ALIVE. It leaves out what the deploy also does: "
          "validation, fact gathering, GPU and fabric detection, the ray user, unit and env files, "
          "NCCL config and load test, the cluster summary." % (RAY_SPEC, NCCL_SPEC))


if __name__ == "__main__":
    sys.exit(main())
