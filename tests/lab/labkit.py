"""Helpers for tests that run against the container lab (lab/lab.sh)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = ROOT / "inventory" / "lab"
VENV_BIN = ROOT / ".venv" / "bin"
LAB_PREFIX = os.environ.get("LAB_PREFIX", "raymetal")
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


def run_playbook(playbook: str, inventory: Path | str, *args: str, timeout: int = 900):
    """Run ansible-playbook from the repo root; return (rc, combined output)."""
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(ROOT / playbook), *args]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout + proc.stderr


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


def recap(output: str) -> dict[str, dict[str, int]]:
    """Parse the PLAY RECAP of ansible-playbook output into {host: {ok:.., changed:..}}."""
    result = {}
    in_recap = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            in_recap = True
            continue
        if in_recap:
            if not line.strip():
                if result:
                    break
                continue
            host, _, counts = line.partition(":")
            result[host.strip()] = {
                k: int(v) for k, v in (kv.split("=") for kv in counts.split())
            }
    return result


def wait_until(predicate, timeout: float, interval: float = 2.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")

