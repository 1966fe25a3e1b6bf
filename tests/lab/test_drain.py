"""Drain, rolling maintenance and node removal on the lab (playbooks/maintenance.yml, remove-node.yml).

The tests share the session's deployed lab (the `cluster` fixture) and leave it as they found it: every
node an ALIVE Ray node, every unit enabled, every firewall admitting every node.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): it drains and removes a worker, then brings it back.
E2E_LAB = 2

HEAD, WORKER1, WORKER2 = labkit.HEAD, labkit.WORKER1, labkit.WORKER2
RELEASE = "/tmp/raymetal-drain-release"
JOB_LOG = "/tmp/raymetal-drain-job.log"
MARKER = "/var/tmp/raymetal-maintenance-done"


def raylet_pid(name):
    return labkit.sh(name, "pgrep -x raylet || true").stdout.strip()


def unit_state(name):
    out = labkit.sh(name, "systemctl show ray-worker -p ActiveState -p UnitFileState").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def gcs_probe(lab, source):
    """A TCP connect from `source` to the head's GCS port: "open", "timeout" (dropped), ..."""
    return labkit.probe_from(source, lab[HEAD]["lab_fabric_ip"], 6379, timeout=4)


def restore(lab):
    """Whatever a test left, deploy again so that the next test finds three alive nodes."""
    if labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()} and unit_state(WORKER2)["UnitFileState"] == "enabled":
        return
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out


def test_maintenance_drains_a_busy_worker_runs_the_command_and_brings_it_back(cluster, lab):
    target_ip = lab[WORKER2]["lab_fabric_ip"]
    head_ip = lab[HEAD]["lab_fabric_ip"]
    others = {name: raylet_pid(name) for name in (HEAD, WORKER1)}
    labkit.sh(WORKER2, f"rm -f {RELEASE} {MARKER}")
    script = (labkit.ROOT / "tests" / "lab" / "drain_job.py").read_text()
    labkit.sh(HEAD, f"cat > /tmp/drain_job.py <<'PY'\n{script}\nPY\nchmod 0644 /tmp/drain_job.py; rm -f {JOB_LOG}")
    job = subprocess.Popen(
        ["docker", "exec", "-u", "ray", HEAD, "bash", "-c",
         f"set -a; . /etc/ray/ray.env; set +a; cd /tmp; python /tmp/drain_job.py {head_ip}:6379 {target_ip} "
         f"{RELEASE} {JOB_LOG}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        labkit.wait_until(lambda: "ready" in labkit.sh(HEAD, f"cat {JOB_LOG} 2>/dev/null", check=False).stdout, 120,
                          interval=1, what="the drain job's actor on worker2")
        cmd = [str(labkit.VENV_BIN / "ansible-playbook"), "-i", str(labkit.LAB_INVENTORY),
               str(labkit.ROOT / "playbooks" / "maintenance.yml"), "-e", f"raymetal_maintenance_hosts={WORKER2}",
               "-e", f"raymetal_maintenance_command='touch {MARKER} && echo maintained'", "-e", "ray_drain_timeout=60"]
        started = time.monotonic()
        play = subprocess.Popen(cmd, cwd=labkit.ROOT, env=labkit.ansible_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        lines = []
        released = False
        for line in play.stdout:
            lines.append(line)
            if not released and line.startswith("TASK [ray : Drain"):
                # The drain starts. Once the GCS has accepted it (the job logs when it first lists worker2 as
                # draining), keep the busy node drained a few seconds more, then let its actor finish. A fixed
                # wait from this line is not enough on a loaded machine: starting Ray's CLI on the head can take
                # longer than the wait itself.
                labkit.wait_until(lambda: '"draining"' in labkit.sh(HEAD, f"cat {JOB_LOG}", check=False).stdout,
                                  120, interval=0.5, what="the GCS to list worker2 as draining")
                time.sleep(5)
                labkit.sh(WORKER2, f"touch {RELEASE}")
                released = True
        rc = play.wait(timeout=60)
        seconds = time.monotonic() - started
        out = "".join(lines)
        job_out = job.communicate(timeout=60)[0]
    finally:
        labkit.sh(WORKER2, f"touch {RELEASE}", check=False)
        if job.poll() is None:
            job.kill()
    try:
        assert rc == 0, out
        assert job.returncode == 0, job_out
        flat = " ".join(out.split())
        drain = re.search(r"drained in ([0-9.]+) s \(Ray node \w+, drain asked at (\d\d):(\d\d):(\d\d) UTC", flat)
        assert drain, out
        back = re.search(r"is an ALIVE Ray node again, ([0-9.]+) s after Ray stopped", flat)
        assert back, out
        print(f"\nmaintenance.yml of {WORKER2}: drained in {drain.group(1)} s (its busy actor was released 5 s "
              f"after the GCS accepted the drain), back ALIVE {back.group(1)} s after the stop, whole run "
              f"{seconds:.1f} s")
        assert float(drain.group(1)) >= 4, drain.group(0)

        records = [json.loads(line) for line in labkit.sh(HEAD, f"cat {JOB_LOG}").stdout.splitlines()]
        runs = [r for r in records if "ip" in r]
        accepted = next(r["draining"] for r in records if "draining" in r)
        # The playbook asked for the drain before the GCS listed it (UTC, as the job's clock: containers share
        # the kernel's; the message has whole seconds).
        hms = tuple(int(x) for x in drain.group(2, 3, 4))
        day = accepted - accepted % 86400
        asked = day + hms[0] * 3600 + hms[1] * 60 + hms[2]
        if asked > accepted + 3600:
            asked -= 86400
        assert asked <= accepted, (drain.group(0), accepted)
        before = [r for r in runs if r["t"] < asked]
        # Tasks of the rounds sent after the GCS listed the drain, with 2 s for the head's scheduler to hear of it.
        during = [r for r in runs if r["t"] > accepted + 2.0]
        assert any(r["ip"] == target_ip for r in before), "no task ran on worker2 before the drain: the test proves nothing"
        assert during, "no task ran after the drain was accepted"
        assert [r for r in during if r["ip"] == target_ip] == [], "tasks landed on the draining worker2"
        assert records[-1].get("released") == target_ip

        assert labkit.sh(WORKER2, f"test -e {MARKER}", check=False).returncode == 0, "the command did not run"
        assert labkit.sh(WORKER1, f"test -e {MARKER}", check=False).returncode != 0
        assert unit_state(WORKER2) == {"ActiveState": "active", "UnitFileState": "enabled"}
        assert labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}
        assert {name: raylet_pid(name) for name in (HEAD, WORKER1)} == others, "another node restarted"
    finally:
        labkit.sh(WORKER2, f"rm -f {RELEASE} {MARKER}", check=False)
        restore(lab)


def test_remove_node_drains_stops_and_firewalls_the_worker_out_then_site_restores_it(cluster, lab, tmp_path):
    removed_ip = lab[WORKER2]["lab_fabric_ip"]
    assert gcs_probe(lab, WORKER2) == "open", "worker2 cannot reach the GCS before the removal: the probe proves nothing"
    # The worker to remove is short of room in Ray's temp dir (the deploy's preflight would refuse it: a minimum it
    # cannot meet): a sick node is what gets removed, so remove-node's checks leave that one out.
    sick = labkit.inventory_copy(tmp_path, {WORKER2: {"ray_temp_dir_min_free_mb": 100_000_000}})
    try:
        started = time.monotonic()
        rc, out, _ = labkit.run_playbook("playbooks/remove-node.yml", sick, "-e", f"raymetal_remove_hosts={WORKER2}")
        removal = time.monotonic() - started
        assert rc == 0, out
        assert "remove them from the inventory" in " ".join(out.split()) or "delete them from the inventory" in " ".join(out.split())
        assert unit_state(WORKER2) == {"ActiveState": "inactive", "UnitFileState": "disabled"}
        assert raylet_pid(WORKER2) == ""
        for name in (HEAD, WORKER1):
            rules = labkit.sh(name, "nft list table inet raymetal").stdout
            assert removed_ip not in rules, (name, rules)
            assert lab[WORKER1]["lab_fabric_ip"] in rules and lab[HEAD]["lab_fabric_ip"] in rules, (name, rules)
        assert gcs_probe(lab, WORKER2) == "timeout", "the head's firewall still answers worker2"
        assert labkit.alive_ips(lab) == {lab[HEAD]["lab_fabric_ip"], lab[WORKER1]["lab_fabric_ip"]}

        started = time.monotonic()
        rc, again, stats = labkit.run_playbook("playbooks/remove-node.yml", sick, "-e", f"raymetal_remove_hosts={WORKER2}")
        rerun = time.monotonic() - started
        assert rc == 0, again
        changed = {host: counts["changed"] for host, counts in stats.items()}
        assert set(changed.values()) == {0}, (changed, again)

        rc, bad, _ = labkit.run_playbook("playbooks/remove-node.yml", labkit.LAB_INVENTORY,
                                      "-e", f"raymetal_remove_hosts={HEAD},nosuchhost")
        assert rc != 0 and "Traceback" not in bad
        flat = " ".join(bad.split())
        assert "raymetal_remove_hosts names nosuchhost" in flat and "names the head" in flat, bad
    finally:
        started = time.monotonic()
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        restored = time.monotonic() - started
    assert rc == 0, out
    print(f"\nremove-node.yml of {WORKER2}: {removal:.1f} s, rerun {rerun:.1f} s (changed=0); "
          f"site.yml brought it back in {restored:.1f} s")
    assert labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}
    assert unit_state(WORKER2) == {"ActiveState": "active", "UnitFileState": "enabled"}
    assert gcs_probe(lab, WORKER2) == "open"
