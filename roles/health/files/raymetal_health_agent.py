"""The node's health loop (issue 36): checks every interval, drains and stops Ray on a FAIL, re-admits.

    raymetal_health_agent.py --config /etc/raymetal/health.json [--once | --readmit | --leave]

Runs on every node without the controller and without Prometheus, as root under systemd
(raymetal-health.service). Each round is ``node_round`` of raymetal_health.py (installed beside this
file: the same code as the acceptance role's node checks); what the round decides is carried out here:

- ``quarantine``: Ray's drain for this node (the ray role's ray_node_drain.py, run with the Ray venv's
  Python and the node's token file: no new task lands here, running ones get the drain deadline), then
  the Ray unit stopped; the quarantine record (kind, class, finding, time) kept in the state file.
- ``readmit``: the Ray unit started again (a transient quarantine whose checks passed
  ``readmit_passes`` rounds in a row), unless the unit is disabled (playbooks/stop.yml keeps a stopped
  cluster down). A hardware quarantine is never lifted here.
- ``hold``: the node stays quarantined; should its Ray run all the same (the unit stays enabled, so a reboot
  starts it, as does a start by hand), it is drained and stopped again.
- ``report``: the head's own faults are logged and exported, never acted on.
- the circuit breaker: before a worker is quarantined, it claims one of ``breaker.limit`` quarantine slots
  kept in the GCS (raymetal_health_breaker.py, run with Ray's venv Python). No slot free, or the GCS not
  reachable: nothing is drained or stopped, the round says why (``raymetal_health_breaker_open`` 1) and the
  next round asks again while the fault lasts. A fabric fault takes no slot: the node is out of the cluster
  whatever the loop does, and the GCS cannot be reached from it. Re-admission releases the slot, which stays
  held ``breaker.window_s`` more seconds (at most ``limit`` quarantines begin in any window).

``--readmit`` is an operator's re-admission after a repair (playbooks/readmit.yml runs it with the loop
stopped): the round's checks once; any FAIL refuses and keeps the record; otherwise the record is cleared
and the Ray unit started. Prints one JSON object (``verdict``, ``findings``, ``record``); exits 0 when the
node was admitted or was not quarantined, 3 when refused, 1 when Ray did not start.

``--leave`` is a node leaving the cluster (playbooks/remove-node.yml runs it with the loop stopped and
disabled): its circuit breaker place, if it holds one, is deleted at once whatever the window. Prints
``{"released": true, "slot": ...}``; exits 1 when the GCS could not be asked.

Every round writes the state file atomically and, where ``metrics_dir`` is set, a node_exporter
textfile (``raymetal_health_quarantined``, ``raymetal_health_findings``, ``raymetal_health_round_timestamp``).
Prints one line per event to stdout (the journal). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import raymetal_health as health  # noqa: E402  (installed beside this file)


def load_json(path, default):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return default


def write_atomic(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def addresses(interface):
    """The interface's IPv4 addresses (`ip -j address`), [] when it has none or is gone."""
    proc = subprocess.run(["ip", "-j", "address", "show", "dev", interface], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        return []
    found = []
    for link in json.loads(proc.stdout or "[]"):
        found += [a["local"] for a in link.get("addr_info", []) if a.get("local")]
    return found


def readers(config):
    smi = config.get("nvidia_smi") or "nvidia-smi"

    def query():
        proc = subprocess.run(health.smi_health_command(smi), capture_output=True, text=True, check=False,
                              env=dict(os.environ, LC_ALL="C"))
        return health.parse_smi_health(proc.stdout) if proc.returncode == 0 else None

    return {"smi": query,
            "kmsg": lambda after: _kmsg(config.get("kernel_log", "/dev/kmsg"), after),
            "driver_gpus": lambda: health.driver_gpus(config.get("nvidia_proc", "/proc/driver/nvidia/gpus")),
            "addresses": addresses,
            "boot_id": lambda: _boot_id(config.get("boot_id_path", "/proc/sys/kernel/random/boot_id"))}


def _boot_id(path):
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _kmsg(path, after):
    try:
        return health.read_kmsg(path, after)
    except OSError:
        return []


def run(argv, timeout, env=None):
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          env=dict(os.environ, **env) if env else None)
    return proc.returncode, (proc.stdout + proc.stderr).strip()[-500:]


# Findings that cut this node off the fabric (the head, its GCS and dashboard, are only reached through it).
FABRIC_CHECKS = ("fabric_link", "fabric_address")


def quarantine(config, record):
    """Drain this node through Ray, then stop its Ray unit; returns what happened, for the record."""
    drain = config.get("drain") or {}
    done = {}
    if drain and record.get("check") in FABRIC_CHECKS:
        # The drain goes to the head over the fabric, which this node just lost: it could only wait for its
        # timeouts. The head's GCS finds the node gone by itself.
        done["drain"] = "not asked: the fabric is down here, the head cannot be reached through it"
    elif drain:
        rc, out = run([drain["python"], drain["script"], drain["dashboard_url"], drain["gcs"], config["address"],
                       drain["token_path"], str(drain.get("deadline_s", 60)), drain["ray_bin"],
                       "raymetal health: %s" % record["finding"][:200]], timeout=int(drain.get("deadline_s", 60)) + 60,
                      env=drain.get("env"))
        done["drain"] = "drained" if rc == 0 else "drain failed (rc %d): %s" % (rc, out)
        done["drained_at"] = time.time()
    systemctl = config.get("systemctl", "systemctl")
    if record.get("check") in FABRIC_CHECKS:
        # Ray's own stop (SIGTERM) first asks the GCS to drain this node and waits for that RPC up to
        # RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (30 s, seen in the lab) over the fabric it no longer has: the stop
        # is queued, then every process of the unit gets SIGKILL, which ends the stop (no restart: a stop job runs).
        run([systemctl, "stop", "--no-block", config["unit"]], timeout=30)
        rc, out = run([systemctl, "kill", "--signal=SIGKILL", config["unit"]], timeout=30)
        done["killed"] = rc == 0
    rc, out = run([systemctl, "stop", config["unit"]], timeout=120)
    done["stopped"] = rc == 0
    done["stopped_at"] = time.time()
    if rc != 0:
        done["stop_error"] = out
    return done


def breaker_call(config, action, now, finding=""):
    """Ask the breaker helper; returns its JSON answer ({"error": ...} when it could not answer)."""
    breaker = config.get("breaker") or {}
    argv = [breaker["python"], breaker["script"], action, "--gcs", breaker["gcs"], "--token-path",
            breaker["token_path"], "--host", config.get("host") or socket.gethostname(), "--limit",
            str(breaker["limit"]), "--window-s", str(breaker.get("window_s", 0)), "--now", str(now)]
    if finding:
        argv += ["--finding", finding]
    try:
        rc, out = run(argv, timeout=int(breaker.get("timeout_s", 30)), env=breaker.get("env"))
    except subprocess.TimeoutExpired:
        return {"error": "the GCS did not answer within %s s" % breaker.get("timeout_s", 30)}
    try:
        answer = json.loads(out.splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "rc %d: %s" % (rc, out[-300:])}
    return answer if isinstance(answer, dict) else {"error": out[-300:]}


def ask_breaker(config, state, now):
    """Before a quarantine: True when this worker may be quarantined (a slot is its own, or the fault takes
    none); False when the breaker is open, with the reason kept in state["breaker"]."""
    record = state["record"]
    if not config.get("breaker") or record.get("check") in FABRIC_CHECKS:
        return True
    answer = breaker_call(config, "claim", now, record.get("finding", ""))
    if answer.get("granted"):
        state["breaker_slot"] = answer.get("slot")
        state.pop("breaker", None)
        # Quarantined again within its place's window: the place is held again (the helper unmarked it).
        state.pop("breaker_free_at", None)
        return True
    if "error" in answer:
        why = "the breaker could not be asked (%s), so nothing is quarantined" % answer["error"]
    else:
        why = "%d of %d quarantine slots held (%s)" % (
            len(answer.get("holders", [])), answer.get("limit", 0),
            ", ".join(h.get("host", "?") for h in answer.get("holders", [])))
    state["breaker"] = {"open": True, "since": (state.get("breaker") or {}).get("since", now), "why": why,
                        "check": record.get("check"), "finding": record.get("finding")}
    state["record"] = None
    return False


def release_slot(config, state, now):
    """At re-admission: the slot is released (held window_s more seconds, then settle() frees it)."""
    if state.pop("breaker_slot", None) is None or not config.get("breaker"):
        return
    answer = breaker_call(config, "release", now)
    window = float(config["breaker"].get("window_s", 0))
    if "error" in answer:
        # Not released: the next round's settle releases it.
        state["breaker_free_at"] = now
    elif window > 0:
        state["breaker_free_at"] = answer["free_at"]


def settle_slot(config, state, now):
    """Once due: the helper releases what a failed release left held and frees what its window let go."""
    if state.get("breaker_free_at") is not None and now >= float(state["breaker_free_at"]):
        answer = breaker_call(config, "settle", now)
        if "error" in answer:
            return
        if answer.get("free_at") is None:
            state.pop("breaker_free_at", None)
        else:
            state["breaker_free_at"] = answer["free_at"]


# What the loop keeps in its state file beside the round's own (health.node_round returns record and kmsg_seq).
KEPT = ("breaker", "breaker_slot", "breaker_free_at")


# The unit states in which Ray runs or is on its way up (a worker's unit waits for the head in ExecStartPre).
RUNNING = ("active", "activating", "reloading")


def unit_state(config):
    """The Ray unit's ActiveState (active, activating, inactive, failed ...), "" when systemctl cannot say."""
    rc, out = run([config.get("systemctl", "systemctl"), "show", "--property=ActiveState", "--value", config["unit"]],
                  timeout=30)
    return out.strip() if rc == 0 else ""


def readmit(config):
    """Start the Ray unit of a node whose quarantine was lifted: (started or not wanted, what to say).

    Only an enabled unit is started: playbooks/stop.yml disables the units of a cluster it stops, so that it stays
    down (across reboots too) until site.yml starts it; a quarantine lifted meanwhile must not start Ray there."""
    systemctl = config.get("systemctl", "systemctl")
    rc, out = run([systemctl, "is-enabled", config["unit"]], timeout=30)
    if out.strip().splitlines()[-1:] in (["disabled"], ["masked"], ["masked-runtime"]):
        return True, "Ray not started: its unit %s is disabled (playbooks/stop.yml stopped the cluster; site.yml " \
                     "starts it)" % config["unit"]
    rc, out = run([systemctl, "start", config["unit"]], timeout=120)
    return rc == 0, "" if rc == 0 else "starting Ray failed: " + out


def metrics(state, findings, now):
    record = state.get("record") or {}
    held_back = state.get("breaker") or {}
    lines = [
        "# HELP raymetal_health_quarantined 1 while raymetal's health loop keeps this node out of the cluster.",
        "# TYPE raymetal_health_quarantined gauge",
        'raymetal_health_quarantined{class="%s",check="%s"} %d' % (
            record.get("class", ""), record.get("check", ""), 1 if record else 0),
        "# HELP raymetal_health_findings Failing checks in the health loop's last round.",
        "# TYPE raymetal_health_findings gauge",
        "raymetal_health_findings %d" % len([f for f in findings if f["severity"] == "fail"]),
        "# HELP raymetal_health_round_timestamp_seconds When the health loop last ran a round.",
        "# TYPE raymetal_health_round_timestamp_seconds gauge",
        "raymetal_health_round_timestamp_seconds %d" % now,
        "# HELP raymetal_health_breaker_open 1 while this node has a FAIL that the circuit breaker kept from "
        "being quarantined.",
        "# TYPE raymetal_health_breaker_open gauge",
        'raymetal_health_breaker_open{check="%s"} %d' % (held_back.get("check") or "", 1 if held_back else 0),
    ]
    return "\n".join(lines) + "\n"


def save(config, state, findings, now):
    """The state file, and the node_exporter textfile where metrics_dir is set, both written atomically."""
    write_atomic(config["state_path"], json.dumps(state, sort_keys=True) + "\n")
    if config.get("metrics_dir"):
        write_atomic(os.path.join(config["metrics_dir"], "raymetal_health.prom"), metrics(state, findings, now))


def one_round(config, now=None, read=None):
    """Run one round and carry out its action; returns (state, findings, action)."""
    now = time.time() if now is None else now
    # No state file: the loop's first round (no kmsg_seq: the kernel log since boot is history to it).
    old = load_json(config["state_path"], {"record": None})
    state, findings, action = health.node_round(config, old, now, read or readers(config))
    state.update((key, old[key]) for key in KEPT if key in old)
    host = config.get("host") or socket.gethostname()
    if action == "quarantine" and not ask_breaker(config, state, now):
        action = "breaker"
        print("%s not quarantined, the circuit breaker is open: %s; finding: %s" % (
            host, state["breaker"]["why"], state["breaker"]["finding"]), flush=True)
    elif not any(f["severity"] == "fail" for f in findings) and state.pop("breaker", None):
        print("%s: the fault the circuit breaker held back is gone" % host, flush=True)
    if action == "quarantine":
        state["record"].update(quarantine(config, state["record"]))
        print("%s quarantined (%s, %s): %s" % (host, state["record"]["class"], state["record"]["check"],
                                               state["record"]["finding"]), flush=True)
    elif action == "readmit":
        release_slot(config, state, now)
        ok, out = readmit(config)
        print("%s re-admitted: its checks passed %s rounds in a row%s" % (
            host, config.get("readmit_passes", 4), "; " + out if out else ""), flush=True)
    elif action in ("worse", "report"):
        print("%s %s: %s" % (host, "is sick (the loop never stops the head)" if action == "report"
                             else "now has a hardware fault", "; ".join(f["message"] for f in findings)), flush=True)
    if action in ("hold", "worse") and config.get("role") != "head" and unit_state(config) in RUNNING:
        # Quarantined, yet Ray runs: its unit stays enabled, so a reboot starts it, and so does a start by hand or
        # a playbook that starts units. Only a re-admission lets Ray run here again.
        state["record"].update(quarantine(config, state["record"]))
        state["record"]["stopped_again"] = int(state["record"].get("stopped_again", 0)) + 1
        print("%s is quarantined (%s, %s) but its Ray was running (started at boot or by hand): stopped again; "
              "playbooks/readmit.yml re-admits it" % (host, state["record"]["class"], state["record"]["check"]),
              flush=True)
    settle_slot(config, state, now)
    save(config, state, findings, now)
    return state, findings, action


def operator_readmit(config, now=None, read=None):
    """playbooks/readmit.yml: (exit code, what to print). The loop must be stopped meanwhile (a running loop
    writes its own record back)."""
    now = time.time() if now is None else now
    state = load_json(config["state_path"], {"record": None, "kmsg_seq": -1})
    record = state.get("record")
    new, findings, verdict = health.operator_readmit(config, state, read or readers(config))
    result = {"verdict": verdict, "record": record,
              "findings": [f for f in findings if f["severity"] == "fail"]}
    code = 3 if verdict == "refused" else 0
    if verdict == "admitted":
        new.update((key, state[key]) for key in KEPT if key in state)
        new.pop("breaker", None)
        release_slot(config, new, now)
        save(config, new, findings, now)
        ok, out = readmit(config)
        result["ray_started"] = ok and not out
        if out and ok:
            result["ray_note"] = out
        if not ok:
            result["ray_error"] = out
            code = 1
        print("%s re-admitted by an operator (was %s, %s)%s" % (
            config.get("host") or socket.gethostname(), record.get("class"), record.get("check"),
            "; " + out if out else ""), file=sys.stderr, flush=True)
    return code, json.dumps(result, sort_keys=True)


def leave(config, now=None):
    """playbooks/remove-node.yml, with the loop stopped: the node leaves the cluster, so its place in the circuit
    breaker (held while it is quarantined, or for the window after a re-admission) is freed at once. Returns
    (exit code, what to print): {"released": true, "held": whether it held a place, "slot": the place it held while
    quarantined or None}, or the error (exit 1). A node whose state holds no place asks nothing of the GCS."""
    now = time.time() if now is None else now
    state = load_json(config["state_path"], {"record": None, "kmsg_seq": -1})
    slot = state.get("breaker_slot")
    held = slot is not None or state.get("breaker_free_at") is not None
    if not config.get("breaker"):
        return 0, json.dumps({"released": False, "held": False, "slot": None, "why": "no circuit breaker on this node"})
    if not held:
        # Nothing to free, so the GCS is not asked: a node removed once is firewalled out of it, and a rerun of the
        # removal must still succeed (and change nothing).
        return 0, json.dumps({"released": False, "held": False, "slot": None,
                              "why": "this node holds no place in the circuit breaker"})
    answer = breaker_call(dict(config, breaker=dict(config["breaker"], window_s=0)), "release", now)
    if "error" in answer:
        return 1, json.dumps({"released": False, "held": held, "slot": slot, "error": answer["error"]})
    for key in KEPT:
        state.pop(key, None)
    write_atomic(config["state_path"], json.dumps(state, sort_keys=True) + "\n")
    return 0, json.dumps({"released": True, "held": held, "slot": slot})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--config", required=True)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one round, then exit")
    mode.add_argument("--readmit", action="store_true",
                      help="an operator's re-admission: the checks once, then the record cleared and Ray started")
    mode.add_argument("--leave", action="store_true",
                      help="the node leaves the cluster (remove-node): its circuit breaker place freed at once")
    args = parser.parse_args(argv)
    config = load_json(args.config, None)
    if config is None:
        print("no configuration at %s" % args.config, file=sys.stderr)
        return 2
    if args.readmit or args.leave:
        code, out = operator_readmit(config) if args.readmit else leave(config)
        print(out, flush=True)
        return code
    while True:
        started = time.monotonic()
        one_round(config)
        if args.once:
            return 0
        time.sleep(max(1.0, float(config.get("interval_s", 15)) - (time.monotonic() - started)))


if __name__ == "__main__":
    sys.exit(main())
