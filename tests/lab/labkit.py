"""Helpers for tests that run against the container lab (lab/lab.sh)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import ansible_runner
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
LAB_PREFIX = os.environ.get("LAB_PREFIX", "raymetal")
# Where lab/lab.sh keeps this lab's inventory and SSH key: the built-in lab
# (inventory/lab), or another prefix's own directory beside it (lab/.labs/PREFIX).
# The same environment variables as lab.sh: a test run and lab.sh agree.
_OWN = ROOT / "lab" / ".labs" / LAB_PREFIX
LAB_INVENTORY = (Path(os.environ["LAB_INVENTORY"]).parent if os.environ.get("LAB_INVENTORY")
                 else ROOT / "inventory" / "lab" if LAB_PREFIX == "raymetal" else _OWN / "inventory")
LAB_STATE = (Path(os.environ["LAB_STATE"]) if os.environ.get("LAB_STATE")
             else ROOT / "lab" / ".state" if LAB_PREFIX == "raymetal" else _OWN / "state")
LAB_KEY = LAB_STATE / "id_ed25519"
# The lab's node names (lab/lab.sh names them <LAB_PREFIX>-head, -worker1, ...).
HEAD = f"{LAB_PREFIX}-head"
WORKER1 = f"{LAB_PREFIX}-worker1"
WORKER2 = f"{LAB_PREFIX}-worker2"


def lab_hosts() -> dict[str, dict]:
    """Inventory name -> {'ansible_host': mgmt IP, 'lab_fabric_ip': ib0 IP, 'group': ...}."""
    data = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())
    hosts = {}
    for group in ("ray_head", "ray_worker"):
        members = data["ray_cluster"]["children"][group].get("hosts") or {}
        for name, hvars in members.items():
            hosts[name] = dict(hvars, group=group)
    return hosts


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    # Keep test runs from reusing facts cached by earlier runs.
    env["ANSIBLE_CACHE_PLUGIN"] = "memory"
    return env


class PlaybookRun(NamedTuple):
    """One ansible-playbook run: exit status, its output, and per-host counters from ansible-runner."""

    rc: int
    output: str
    # {host: {"ok": n, "changed": n, "unreachable": n, "failed": n, "skipped": n, "rescued": n, "ignored": n}},
    # from ansible-runner's playbook_on_stats event (the counters the PLAY RECAP prints), {} when the
    # run ended before it.
    stats: dict[str, dict[str, int]]


# ansible-runner's names for the counters -> the names the PLAY RECAP prints.
_COUNTERS = {"ok": "ok", "changed": "changed", "dark": "unreachable", "failures": "failed",
             "skipped": "skipped", "rescued": "rescued", "ignored": "ignored"}


def _host_stats(event_data: dict) -> dict[str, dict[str, int]]:
    hosts = set().union(*(event_data.get(name) or {} for name in _COUNTERS))
    return {host: {recap: (event_data.get(name) or {}).get(host, 0) for name, recap in _COUNTERS.items()}
            for host in hosts}


def run_playbook(playbook: str, inventory: Path | str, *args: str, timeout: int = 900,
                 on_event: Callable[[dict], None] | None = None) -> PlaybookRun:
    """Run ansible-playbook from the repo root through ansible-runner.

    Unpacks as (rc, output, stats): stats are ansible-runner's per-host counters
    (ok, changed, failures, dark, skipped, ...), not a parse of the PLAY RECAP text.
    on_event, when given, sees every ansible-runner event as it happens (a test can act mid-run).
    """
    stats: dict[str, dict[str, int]] = {}

    def handle(event: dict) -> bool:
        if on_event is not None:
            on_event(event)
        if event.get("event") == "playbook_on_stats":
            stats.update(_host_stats(event.get("event_data") or {}))
        return True

    env = ansible_env()
    with tempfile.TemporaryDirectory(prefix="labkit-run-") as private:
        result = ansible_runner.run(
            private_data_dir=private, project_dir=str(ROOT), playbook=str(ROOT / playbook),
            inventory=str(inventory), cmdline=shlex.join(args) if args else None,
            envvars={k: env[k] for k in ("ANSIBLE_CONFIG", "PATH", "ANSIBLE_NOCOLOR", "ANSIBLE_FORCE_COLOR",
                                          "ANSIBLE_CACHE_PLUGIN")},
            event_handler=handle, quiet=True, suppress_env_files=True, timeout=timeout,
            # Not ansible-runner's default jsonfile fact cache: the memory cache, as ansible-playbook gets from
            # ansible.cfg (see raymetal/runner.py).
            fact_cache_type="memory")
        output = result.stdout.read().replace("\r\n", "\n")
    if result.status == "timeout":
        raise subprocess.TimeoutExpired(["ansible-playbook", playbook, *args], timeout, output)
    return PlaybookRun(result.rc, output, stats)


def inventory_copy(tmp_path: Path, host_vars: dict[str, dict] | None = None) -> Path:
    """The lab inventory copied under tmp_path (same token: credentials/ is linked), with extra host_vars.

    The copy has the lab inventory's name and its credentials by link, so that the deploy's inputs differ from the
    lab's only by those host_vars: a deploy from it sends only the hosts given (and the head) the full path, as a
    site's edit of host_vars/<host>.yml does (the fast path per host)."""
    inv = Path(tmp_path) / LAB_INVENTORY.name
    shutil.copytree(LAB_INVENTORY, inv, ignore=shutil.ignore_patterns("credentials", "acceptance"))
    (inv / "credentials").symlink_to(LAB_INVENTORY / "credentials")
    (inv / "host_vars").mkdir(exist_ok=True)
    for host, values in (host_vars or {}).items():
        (inv / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values))
    return inv


def counting_deploy(inventory, extravars=None, tasks=None):
    """raymetal.runner.deploy(); (facts, ['host: task' that changed]). tasks, a list, gets every 'host: task' that
    ran (ok or failed)."""
    from raymetal.runner import deploy

    changed = []
    facts = deploy(str(inventory), extravars=extravars, on_event=_task_counter(changed, tasks))
    return facts, changed


def _task_counter(changed: list, tasks: list | None) -> Callable[[dict], None]:
    """An on_event for raymetal.runner's task results ({host, task, status, changed}): 'host: task' of each changed
    one into changed, and of each one that ran (ok or failed) into tasks, when given."""
    def on_event(item):
        if item.get("changed"):
            changed.append(f"{item['host']}: {item['task']}")
        if tasks is not None and item.get("status") in ("ok", "failed"):
            tasks.append(f"{item['host']}: {item['task']}")
    return on_event


class NodeState(NamedTuple):
    """What full_rerun reads on the nodes just before and just after its run."""
    job: str      # the running job's status
    nodes: dict   # alive_nodes()
    units: dict   # invocation_ids()
    pids: dict    # MainPID of prometheus (the head) and of each node's node_exporter


class FullRerun(NamedTuple):
    """One site.yml run with every task (raymetal_fast_path false) on a deployed cluster with a job running."""
    rc: int
    output: str
    stats: dict
    ran: list          # 'host: task' of every task result, ok or failed (as counting_deploy's tasks)
    changed: list      # 'host: task' of every changed result
    facts: dict        # the ray_cluster stats it published (raymetal.runner.deploy's answer)
    before: NodeState
    after: NodeState


def main_pid(container: str, unit: str) -> str:
    """systemd's MainPID of a unit on a lab node ('0' when it does not run)."""
    return sh(container, f"systemctl show -p MainPID --value {unit}").stdout.strip()


def job_status(lab: dict[str, dict], job_id: str) -> str:
    """A Ray job's status from the head's job API over the fabric (with the token), or the start of its answer."""
    out = sh(HEAD, f"curl -s -m 10 -H \"Authorization: Bearer $(cat /etc/ray/auth_token)\" "
                   f"http://{lab[HEAD]['lab_fabric_ip']}:8265/api/jobs/{job_id}", check=False).stdout
    try:
        return json.loads(out).get("status", out[:200])
    except ValueError:
        return out[:200]


@contextlib.contextmanager
def sleeper_job(lab: dict[str, dict]) -> Iterator[str]:
    """A Ray job that sleeps 15 minutes, submitted on the head with the token and RUNNING; yields its ID, stopped
    afterwards."""
    ray = "set -a; . /etc/ray/ray.env; set +a; cd /tmp && /opt/ray/venv/bin/ray job"
    address = f"http://{lab[HEAD]['lab_fabric_ip']}:8265"
    job_id = f"raymetal-rerun-probe-{os.urandom(4).hex()}"
    sh(HEAD, f"{ray} submit --address {address} --no-wait --submission-id {job_id} -- "
             "python -c 'import time; time.sleep(900)'")
    try:
        wait_until(lambda: job_status(lab, job_id) == "RUNNING", 120, what=f"job {job_id} RUNNING")
        yield job_id
    finally:
        sh(HEAD, f"{ray} stop --address {address} {job_id}", check=False)


def full_rerun(lab: dict[str, dict]) -> FullRerun:
    """site.yml again with every task, not the fast path, while a job runs: one run that several tests read (the
    cluster fixture's deploy is already the converge). With the fast path, a rerun would run none of the roles' tasks,
    so a rerun that proves the roles change nothing and restart nothing must take this one."""
    from raymetal.runner import progress

    def state(job_id):
        pids = {"prometheus": main_pid(HEAD, "prometheus"),
                **{name: main_pid(name, "prometheus-node-exporter") for name in lab}}
        return NodeState(job_status(lab, job_id), alive_nodes(lab), invocation_ids(lab), pids)

    ran, changed, facts = [], [], {}
    count = _task_counter(changed, ran)

    def on_event(event):
        item = progress(event)
        if item is not None:
            count(item)
        if event.get("event") == "playbook_on_stats":
            facts.update(((event.get("event_data") or {}).get("artifact_data") or {}).get("ray_cluster") or {})

    with sleeper_job(lab) as job_id:
        before = state(job_id)
        rc, output, stats = run_playbook("site.yml", LAB_INVENTORY, "-e", '{"raymetal_fast_path": false}',
                                         on_event=on_event)
        after = state(job_id)
    return FullRerun(rc, output, stats, ran, changed, facts, before, after)


def cluster_scenario_check_and_verify(lab: dict[str, dict]) -> None:
    """The molecule cluster scenario's check and verify steps on this lab's converged cluster
    (extensions/molecule/cluster): site.yml in check mode with every task (not the fast path) plans nothing and
    restarts nothing, then the scenario's verify.yml passes on every node."""
    head = next(name for name, host in lab.items() if host["group"] == "ray_head")
    worker = next(name for name, host in lab.items() if host["group"] != "ray_head")
    before = invocation_ids(lab)
    rc, out, stats = run_playbook("site.yml", LAB_INVENTORY, "--check", "--diff",
                                  "-e", json.dumps({"raymetal_fast_path": False}))
    assert rc == 0, out[-4000:]
    assert sorted(h for h in stats if h != "localhost") == sorted(lab), stats
    assert all(s["changed"] == 0 and s["failed"] == 0 for s in stats.values()), stats
    # The full path, not the fast one: Ray's files were compared on every node.
    assert out.count("TASK [ray : Write Ray's directories, token, environment, unit") == 1 and stats[worker]["ok"] > 50
    assert invocation_ids(lab) == before
    nets = {"molecule_cluster_fabric_net": lab[head]["lab_fabric_ip"].rsplit(".", 1)[0],
            "molecule_cluster_mgmt_net": lab[head]["ansible_host"].rsplit(".", 1)[0]}
    rc, out, stats = run_playbook("extensions/molecule/cluster/verify.yml", LAB_INVENTORY, "-e", json.dumps(nets))
    assert rc == 0, out[-4000:]
    # Every play ran its checks on the hosts it names (three nodes, the head, a worker): none was skipped.
    assert sorted(stats) == sorted(lab), stats
    assert all(s["ok"] > 0 and s["failed"] == 0 for s in stats.values()), stats
    assert "Check that Ray and NCCL came in one pip run" in out and "Check that the dashboard does not listen" in out


# ray-node-start's record of the stops Ray made by itself (the ray role's ray_restart_backoff_max).
RESTART_RECORD = "/var/lib/ray/restarts.json"


# The wheelhouse mirror's access log on the head (syslog tag raymetal_wheelhouse):
# 'ADDRESS CONNECTION "GET /FILE HTTP/1.1" STATUS BYTES'.
MIRROR_ACCESS = re.compile(r'^(?P<ip>\d+\.\d+\.\d+\.\d+) (?P<conn>\d+) "GET /(?P<file>\S*) HTTP/[\d.]+" '
                           r'(?P<status>\d+) (?P<bytes>\d+)')


def mirror_access_log(since: float | None = None) -> list[tuple[str, str, str, str, int]]:
    """The mirror's answered GETs in order, since a time.time() if given: [(IP, connection, path, status, bytes)]."""
    when = f" --since=@{int(since)}" if since is not None else ""
    log = sh(HEAD, f"journalctl -t raymetal_wheelhouse -o cat --no-pager{when}").stdout
    return [(m["ip"], m["conn"], "/" + m["file"], m["status"], int(m["bytes"]))
            for m in (MIRROR_ACCESS.match(line.strip()) for line in log.splitlines()) if m]


def mirror_pip_runs(ip: str, log: list[tuple[str, str, str, str, int]]) -> list[list[str]]:
    """The wheels each pip run of one node fetched, from mirror_access_log()'s answer: one pip run reads them all
    over one keep-alive connection."""
    runs: dict[str, list[str]] = {}
    for who, conn, path, status, _ in log:
        if who == ip and status == "200" and path.endswith(".whl"):
            runs.setdefault(conn, []).append(path[1:])
    return list(runs.values())


def restart_record(name: str) -> dict:
    """A node's backoff record ({"stops": [unix times], "stopping": bool}); {} when there is none."""
    return json.loads(sh(name, f"cat {RESTART_RECORD} 2>/dev/null || echo '{{}}'").stdout)


def set_restart_record(name: str, record: dict) -> None:
    sh(name, f"echo {shlex.quote(json.dumps(record))} > {RESTART_RECORD} && chown ray: {RESTART_RECORD}")


def unit_of(lab: dict[str, dict], name: str) -> str:
    """The Ray unit of a lab node: ray-head on the head, ray-worker elsewhere."""
    return "ray-head" if lab[name]["group"] == "ray_head" else "ray-worker"


def invocation_ids(lab: dict[str, dict], names=None) -> dict[str, str]:
    """systemd's InvocationID of each node's Ray unit: it changes with every (re)start of the unit."""
    return {name: sh(name, f"systemctl show -p InvocationID --value {unit_of(lab, name)}").stdout.strip()
            for name in (lab if names is None else names)}


# Names the management NIC eth0 again once the image's raymetal-lab-fabric unit has named the fabric NIC ib0.
_MGMT_NAME = """
for i in $(seq 100); do ip link show ib0 >/dev/null 2>&1 && break; sleep 0.2; done
dev=$(ip -o -4 addr show | awk -v want="$1" '{split($4, a, "/"); if (a[1] == want) {print $2; exit}}')
[ -z "$dev" ] || [ "$dev" = eth0 ] || ip link show eth0 >/dev/null 2>&1 \
  || { ip link set "$dev" down && ip link set "$dev" name eth0 && ip link set eth0 up; }
"""


def start_node(name: str) -> None:
    """docker start a stopped lab node (a powered-off host coming back) with the NIC names it had.

    Docker attaches the lab's two networks in either order at a start: the image's raymetal-lab-fabric unit names
    the fabric NIC ib0 again, and this names the management NIC eth0 again (a real host's NIC names survive a
    power cycle; tests that read the candidates of fabric_facts expect eth0). Through docker exec, not SSH.
    """
    subprocess.run(["docker", "start", name], check=True, capture_output=True, timeout=120)
    mgmt = lab_hosts()[name]["ansible_host"]
    subprocess.run(["docker", "exec", name, "sh", "-c", _MGMT_NAME, "sh", mgmt], check=True, capture_output=True,
                   timeout=60)


def sh(container: str, script: str, *, check: bool = True, timeout: int = 120, user: str | None = None):
    """Run a shell script inside a lab container; return CompletedProcess."""
    cmd = ["docker", "exec"]
    if user:
        cmd += ["-u", user]
    cmd += [container, "bash", "-c", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{container}: {script!r} exited {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
        )
    return proc


def probe_from_controller(ip: str, port: int, timeout: float = 3) -> str:
    """Try a TCP connection from the controller (on both lab networks, never a cluster member).

    Returns "open", "timeout" (a firewall that drops), "refused" (nothing listens, or a reject),
    or "error N" for any other socket error (errno N).
    """
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return "open"
    except socket.timeout:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as err:
        return f"error {err.errno}"


# The same probe, run by a node's python3 (stdlib only): prints what probe_from_controller returns.
_NODE_PROBE = """import socket, sys
s = socket.socket(); s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print("open")
except socket.timeout:
    print("timeout")
except ConnectionRefusedError:
    print("refused")
except OSError as err:
    print("error", err.errno)
"""


def probe_from(container: str, ip: str, port: int, timeout: float = 3) -> str:
    """Try a TCP connection from inside a lab container; same answers as probe_from_controller."""
    proc = subprocess.run(["docker", "exec", container, "python3", "-c", _NODE_PROBE, ip, str(port), str(timeout)],
                          capture_output=True, text=True, timeout=timeout + 30)
    if proc.returncode != 0:
        raise AssertionError(f"{container}: the port probe did not run ({proc.returncode}): {proc.stderr}")
    return proc.stdout.strip()


def probe_all(probes: list[tuple[str | None, str, int]], timeout: float = 3) -> list[str]:
    """Many probes at once: [(container or None for the controller, ip, port)] -> their answers, in order.

    A dropped probe waits its whole timeout; run one by one, a test of eight closed ports waits 24 s.
    """
    def one(probe):
        source, ip, port = probe
        return probe_from_controller(ip, port, timeout) if source is None else probe_from(source, ip, port, timeout)

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(one, probes))


def alive_nodes(lab: dict[str, dict]) -> dict[str, str]:
    """{fabric IP: Ray node ID} of the ALIVE nodes, from the head's state API over the fabric (with the token).

    {} while the API does not answer (a head restarting); never raises for that.
    """
    ip = lab[HEAD]["lab_fabric_ip"]
    proc = sh(HEAD, f"curl -s -m 10 -H \"Authorization: Bearer $(cat /etc/ray/auth_token)\" "
                    f"http://{ip}:8265/api/v0/nodes?detail=true", check=False)
    try:
        nodes = json.loads(proc.stdout)["data"]["result"]["result"]
    except (ValueError, KeyError, TypeError):
        return {}
    return {n["node_ip"]: n["node_id"] for n in nodes if n["state"] == "ALIVE"}


def raylet_registered(lab: dict[str, dict], name: str) -> bool:
    """True once the raylet running on `name` is the node the GCS lists ALIVE at its fabric IP.

    A raylet process that runs is not yet a member: it registers with the GCS after it starts, and the GCS
    can still list the node's previous raylet as ALIVE meanwhile. Ray passes the node ID on the raylet's
    command line (--node_id=<hex>).
    """
    cmdline = sh(name, "tr '\\0' '\\n' < /proc/$(pgrep -xo raylet)/cmdline", check=False).stdout.split()
    ids = [arg.split("=", 1)[1] for arg in cmdline if arg.startswith("--node_id=")]
    return bool(ids) and alive_nodes(lab).get(lab[name]["lab_fabric_ip"]) == ids[0]


def alive_ips(lab: dict[str, dict]) -> set[str]:
    """Fabric IPs of the ALIVE nodes (see alive_nodes)."""
    return set(alive_nodes(lab))


def wait_until(predicate, timeout: float, interval: float = 2.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


# What the health loop prints when it acts on a node (roles/health/files/raymetal_health_agent.py): a quarantine, a
# FAIL the circuit breaker held back, a worse (hardware) finding, a sick head.
HEALTH_ACTS = (" quarantined (", "circuit breaker is open", "now has a hardware fault", "is sick")
HEALTH_STATE = "/var/lib/raymetal-health/state.json"


def _held_record(state_text: str):
    """The quarantine record in the text of a health loop's state file, or None (none held, no file, unreadable)."""
    try:
        return json.loads(state_text).get("record") if state_text.strip() else None
    except (ValueError, AttributeError):
        return None


def health_record(name: str):
    """The quarantine record the node's health loop holds (its state file), or None: none held, no loop there."""
    return _held_record(sh(name, f"cat {HEALTH_STATE} 2>/dev/null", check=False).stdout)


def false_quarantines(hosts, since: float, windows, run=None) -> list[str]:
    """What each node's health loop did to a healthy node: its lines of HEALTH_ACTS in its journal since `since`
    (epoch seconds; this boot's journal) outside the (start, end) windows of the tests that made faults, and the
    quarantine records still held (the state file survives the lab's reboots). Empty when nothing. run(node, script)
    returns the script's output (default: sh on the node)."""
    run = run or (lambda node, script: sh(node, script, check=False).stdout)
    found = []
    for name in hosts:
        journal = run(name, f"journalctl -u raymetal-health -o short-unix --no-pager --since @{int(since)}")
        for line in journal.splitlines():
            stamp, _, text = line.partition(" ")
            if not any(act in text for act in HEALTH_ACTS):
                continue
            try:
                when = float(stamp)
            except ValueError:
                continue
            if not any(start <= when <= end for start, end in windows):
                found.append(f"{name}: {line.strip()}")
        record = _held_record(run(name, f"cat {HEALTH_STATE} 2>/dev/null"))
        if record:
            found.append(f"{name}: still quarantined at the end: {json.dumps(record, sort_keys=True)}")
    return found


WEBHOOK_PORT = 9099
WEBHOOK_LOG = "/tmp/raymetal-test-webhook.log"


@contextlib.contextmanager
def webhook_recorder(node: str) -> Iterator[str]:
    """lab/webhook_recorder.py on node's loopback, as a transient unit: Alertmanager's receiver (a pager's stand-in).
    Yields its URL (for monitoring_alertmanager_webhooks); stopped and its log removed afterwards."""
    script = (ROOT / "lab" / "webhook_recorder.py").read_text()
    sh(node, f"cat > /tmp/raymetal-test-webhook.py <<'RAYMETAL_EOF'\n{script}RAYMETAL_EOF\nrm -f {WEBHOOK_LOG}; "
             f"systemd-run --unit raymetal-test-webhook --collect python3 /tmp/raymetal-test-webhook.py "
             f"{WEBHOOK_PORT} {WEBHOOK_LOG}")
    try:
        yield f"http://127.0.0.1:{WEBHOOK_PORT}/"
    finally:
        sh(node, f"systemctl stop raymetal-test-webhook; rm -f /tmp/raymetal-test-webhook.py {WEBHOOK_LOG}", check=False)


@functools.cache
def _webhook_recorder_module():
    """lab/webhook_recorder.py as a module (it is a script copied to the node, not a package): loaded once."""
    spec = importlib.util.spec_from_file_location("webhook_recorder", ROOT / "lab" / "webhook_recorder.py")
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)
    return recorder


def webhook_first_firing(node: str, host: str, after: float = 0.0):
    """(when, alert names) of the first notification the recorder on node got at or after `after` (epoch seconds)
    with an alert firing for host; None before there is one."""
    return _webhook_recorder_module().first_firing(sh(node, f"cat {WEBHOOK_LOG} 2>/dev/null", check=False).stdout,
                                                   host, after)


@contextlib.contextmanager
def outsider_on_fabric(lab: dict[str, dict], name: str, host_octet: int) -> Iterator[str]:
    """A container of the lab's image on the lab's fabric network, not in the inventory: a stranger on
    the fabric for the firewall's probes. Yields its name (LAB_PREFIX-name); removed afterwards."""
    image = subprocess.run(["bash", str(ROOT / "lab" / "lab.sh"), "image-name"],
                           capture_output=True, text=True, check=True).stdout.strip()
    fabric_ip = lab[HEAD]["lab_fabric_ip"].rsplit(".", 1)[0] + f".{host_octet}"
    container = f"{LAB_PREFIX}-{name}"
    subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    subprocess.run(
        ["docker", "run", "-d", "--name", container, "--label", f"io.raymetal.lab={LAB_PREFIX}",
         "--network", f"{LAB_PREFIX}-fabric", "--ip", fabric_ip, "--entrypoint", "sleep", image, "infinity"],
        capture_output=True, text=True, check=True,
    )
    try:
        yield container
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
