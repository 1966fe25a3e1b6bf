"""The node health loop on the lab (roles/health, issue 36): a worker off the fabric is quarantined and comes back.

The health loop is off by default, so this module deploys the lab with it on (a copy of the lab inventory with
health_enabled and a short interval), takes ib0 down on a worker (the real fault: the link Ray's address is on),
and sees that worker's own loop drain and stop Ray there, keep the record and the metric, while every other node
keeps its raylet; then brings ib0 up and sees the worker ALIVE in the cluster again with nobody running anything.
Then a hardware quarantine record (what the loop keeps for an Xid 79) on a worker and a plain deploy: Ray stays
stopped there, nothing changes on it, the run names it quarantined; playbooks/readmit.yml refuses it while a check
still fails and re-admits it once the fault is gone. Then the circuit breaker (a limit of one worker): each
worker's Ray temp dir (a tmpfs of its own) filled with fallocate, the first worker quarantined as transient, the
second kept running with the breaker's metric and reason; both freed, the first re-admitted by its loop. It ends
with the deploy of the lab's own inventory (health_enabled false): the loop is stopped, disabled and removed
everywhere, and the lab is as the other tests expect it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): it needs no Debian 12 of its own, and lab 1 is the busier.
E2E_LAB = 2

HEAD, WORKER1, WORKER2 = labkit.HEAD, labkit.WORKER1, labkit.WORKER2
# A round every 5 s and 3 passing rounds to re-admit (the defaults, 15 s and 4, re-admit after a minute of
# passing rounds: longer than this test's budget on a loaded 2-core lab machine).
HEALTH_VARS = {"health_enabled": True, "health_interval_s": 5, "health_readmit_passes": 3,
               # The breaker's defaults (10 % of the workers, at least one) give the lab's two workers a limit of
               # one; a re-admitted worker's place is free at once here (the default keeps it an hour).
               "health_breaker_window_s": 0}
# Each worker's Ray temp dir on a tmpfs of its own, so that filling it (fallocate) fills nothing else: the lab's
# nodes share the host's disk.
TMPFS = "/srv/raymetal-test-tmp"
WORKER_VARS = dict(HEALTH_VARS, ray_temp_dir=TMPFS, ray_temp_dir_min_free_mb=100, health_temp_dir_min_free_mib=128)
FILL = f"{TMPFS}/raymetal-test-fill"
STATE = "/var/lib/raymetal-health/state.json"
PROM = "/var/lib/prometheus/node-exporter/raymetal_health.prom"
# What the role installs (its switch-off removes these and nothing else).
INSTALLED = ["/etc/systemd/system/raymetal-health.service", "/etc/raymetal/health.json",
             "/usr/local/libexec/raymetal-health"]


def unit(name, unit_name):
    out = labkit.sh(name, f"systemctl show {unit_name} -p ActiveState -p UnitFileState -p LoadState").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def state(name):
    out = labkit.sh(name, f"cat {STATE} 2>/dev/null", check=False).stdout
    return json.loads(out) if out.strip() else None


def put_record(name, record):
    """Set the loop's quarantine record on a node as the loop keeps it (the loop stopped meanwhile, so that its
    next round reads this record rather than writing its own over it)."""
    labkit.sh(name, "systemctl stop raymetal-health")
    current = state(name) or {"kmsg_seq": -1}
    current["record"] = record
    labkit.sh(name, f"cat > {STATE}.new <<'EOF'\n{json.dumps(current)}\nEOF\nmv {STATE}.new {STATE}")
    labkit.sh(name, "systemctl start raymetal-health")


def ib0_restored(name, ip):
    """ib0 up with its fabric address (the test's own repair: a fault test must never leave the lab broken)."""
    labkit.sh(name, f"ip link set ib0 up; ip -4 -o address show dev ib0 | grep -qw {ip} || "
                    f"ip address add {ip}/24 dev ib0", check=False)


def test_a_worker_off_the_fabric_is_quarantined_and_comes_back_by_itself(cluster, lab, tmp_path):
    w1_ip = lab[WORKER1]["lab_fabric_ip"]
    inventory = labkit.inventory_copy(tmp_path, {name: HEALTH_VARS if name == HEAD else WORKER_VARS for name in lab})
    for name in (WORKER1, WORKER2):
        labkit.sh(name, f"mkdir -p {TMPFS} && mount -t tmpfs -o size=320m,mode=1770 tmpfs {TMPFS}")
    try:
        started = time.monotonic()
        rc, out, stats = labkit.run_playbook("site.yml", inventory)
        assert rc == 0, out[-6000:]
        print(f"deploy with the health loop on: {time.monotonic() - started:.0f} s")
        # Every node runs the loop; on the healthy lab (no GPU: no GPU check) nothing is quarantined.
        for name in lab:
            assert unit(name, "raymetal-health")["ActiveState"] == "active", name
            labkit.wait_until(lambda name=name: state(name), 30, 1, f"{name}'s first round")
            assert state(name)["record"] is None, (name, state(name))
        config = json.loads(labkit.sh(WORKER1, "cat /etc/raymetal/health.json").stdout)
        assert (config["role"], config["interface"], config["address"], config["gpus"]) == ("worker", "ib0", w1_ip, [])
        assert config["drain"]["script"] == "/usr/local/libexec/raymetal/ray-node-drain"
        assert (config["breaker"]["limit"], config["breaker"]["gcs"], config["temp_dir"]) == (
            1, f"{lab[HEAD]['lab_fabric_ip']}:6379", TMPFS), config["breaker"]
        assert json.loads(labkit.sh(HEAD, "cat /etc/raymetal/health.json").stdout)["drain"] == {}
        assert labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}
        others = labkit.invocation_ids(lab, [HEAD, WORKER2])

        # The fault: the fabric link Ray's address is on goes down.
        labkit.sh(WORKER1, "ip link set ib0 down")
        fault = time.monotonic()
        labkit.wait_until(lambda: unit(WORKER1, "ray-worker")["ActiveState"] in ("inactive", "failed"), 30, 1,
                          f"{WORKER1}'s loop to stop Ray there within 30 s of ib0 down")
        stopped_after = time.monotonic() - fault
        record = state(WORKER1)["record"]
        assert (record["state"], record["class"], record["check"], record["stopped"]) == (
            "quarantined", "transient", "fabric_link", True), record
        assert record["drain"].startswith("not asked: the fabric is down here"), record
        prom = labkit.sh(WORKER1, f"cat {PROM}").stdout
        assert 'raymetal_health_quarantined{class="transient",check="fabric_link"} 1' in prom, prom
        assert "quarantined (transient, fabric_link)" in labkit.sh(
            WORKER1, "journalctl -u raymetal-health --no-pager -o cat").stdout
        # The cluster sees it gone; the head and the other worker kept their raylets.
        labkit.wait_until(lambda: w1_ip not in labkit.alive_ips(lab), 90, 2, f"the head to see {WORKER1} gone")
        gone_after = time.monotonic() - fault
        assert labkit.invocation_ids(lab, [HEAD, WORKER2]) == others
        assert state(HEAD)["record"] is None and state(WORKER2)["record"] is None

        # The repair: ib0 up (its address is still there: a link down keeps it). Nobody runs anything.
        labkit.sh(WORKER1, "ip link set ib0 up")
        repaired = time.monotonic()
        ib0_restored(WORKER1, w1_ip)
        labkit.wait_until(lambda: w1_ip in labkit.alive_ips(lab), 60, 2,
                          f"{WORKER1} ALIVE again within 60 s of ib0 up, re-admitted by its own loop")
        alive_after = time.monotonic() - repaired
        assert state(WORKER1)["record"] is None
        assert "re-admitted: its checks passed 3 rounds in a row" in labkit.sh(
            WORKER1, "journalctl -u raymetal-health --no-pager -o cat").stdout
        # node_exporter exports the loop's metric (scraped from the head, the monitoring host).
        metrics = labkit.sh(HEAD, f"curl -s -m 10 http://{w1_ip}:9100/metrics").stdout
        assert 'raymetal_health_quarantined{check="",class=""} 0' in metrics, [
            line for line in metrics.splitlines() if "raymetal_health" in line]
        assert labkit.invocation_ids(lab, [HEAD, WORKER2]) == others
        print(f"ib0 down -> Ray stopped on {WORKER1}: {stopped_after:.1f} s; -> not ALIVE at the head: "
              f"{gone_after:.1f} s; ib0 up -> ALIVE again: {alive_after:.1f} s")

        # A hardware quarantine (the record the loop keeps for an Xid 79: held until an operator acts; the lab has
        # no GPU, so the record is put where the loop keeps it, with the loop stopped meanwhile, and Ray stopped as
        # the loop stops it). A plain deploy does not undo it: Ray stays stopped there, nothing changes on that
        # worker, the run names it quarantined, and its record of the last deploy is not rewritten (so the next
        # deploy reads the quarantine again instead of waiting for the worker on the fast path).
        hardware = {"state": "quarantined", "class": "hardware", "check": "gpu_xid", "subject": "0000:1b:00.0",
                    "finding": "Xid 79 on 0000:1b:00.0 (the GPU has fallen off the bus)", "since": time.time(),
                    "passes": 0}
        put_record(WORKER1, hardware)
        labkit.sh(WORKER1, "systemctl stop ray-worker")
        labkit.wait_until(lambda: w1_ip not in labkit.alive_ips(lab), 90, 2, f"the head to see {WORKER1} gone")
        applied_before = labkit.sh(WORKER1, "stat -c %Y /var/lib/raymetal/applied.json").stdout
        rc, out, stats = labkit.run_playbook("site.yml", inventory)
        assert rc == 0, out[-6000:]
        flat = " ".join(out.split())
        assert (f"{WORKER1}: quarantined by the health loop (hardware, gpu_xid): Xid 79 on 0000:1b:00.0" in flat
                and "A hardware fault is never re-admitted by the loop" in flat), out[-6000:]
        assert "Left out of the cluster by this run" in flat, out[-6000:]
        assert stats[WORKER1]["changed"] == 0, stats
        assert unit(WORKER1, "ray-worker")["ActiveState"] == "inactive"
        assert state(WORKER1)["record"]["class"] == "hardware"
        assert labkit.sh(WORKER1, "stat -c %Y /var/lib/raymetal/applied.json").stdout == applied_before
        assert labkit.invocation_ids(lab, [HEAD, WORKER2]) == others
        # status.yml names it quarantined, with the record's class and check, not missing, and fails (2, all that
        # ansible-playbook has); `python -m raymetal status` tells the case apart by its exit status, 3.
        rc, out, _ = labkit.run_playbook("playbooks/status.yml", inventory)
        flat = " ".join(out.split())
        assert rc == 2 and "1 worker(s) quarantined by the health loop" in flat, out[-6000:]
        assert f"{WORKER1}: quarantined by the health loop (hardware, gpu_xid)" in flat, out[-6000:]
        assert "not an ALIVE Ray node:" not in flat and "Out of the cluster (Ray stopped there" in flat, out[-6000:]
        cli = subprocess.run([sys.executable, "-m", "raymetal", "status", "-i", str(inventory)], capture_output=True,
                             text=True, cwd=labkit.ROOT, env=labkit.ansible_env(), timeout=300)
        assert cli.returncode == 3, (cli.returncode, cli.stdout[-3000:], cli.stderr[-3000:])
        assert f"{WORKER1}: quarantined by the health loop (hardware, gpu_xid)" in cli.stdout, cli.stdout

        # The operator's re-admission (playbooks/readmit.yml). Refused while a check still fails (the lab has no GPU
        # to stay broken: ib0 down stands in for the fault that remains): the record and Ray's stop are kept.
        cursor = state(WORKER1)["kmsg_seq"]
        labkit.sh(WORKER1, "ip link set ib0 down")
        rc, out, _ = labkit.run_playbook("playbooks/readmit.yml", inventory, "-e", f"raymetal_readmit_hosts={WORKER1}")
        flat = " ".join(out.split())
        assert rc != 0 and f"{WORKER1} stays quarantined" in flat and "ib0" in flat.split("stays quarantined")[1], (
            out[-6000:])
        assert state(WORKER1)["record"]["class"] == "hardware"
        assert unit(WORKER1, "ray-worker")["ActiveState"] == "inactive"
        assert unit(WORKER1, "raymetal-health")["ActiveState"] == "active"
        # Repaired: admitted, the record cleared with the kernel log cursor kept, Ray started, ALIVE at the head.
        ib0_restored(WORKER1, w1_ip)
        rc, out, stats = labkit.run_playbook("playbooks/readmit.yml", inventory, "-e", f"raymetal_readmit_hosts={WORKER1}")
        flat = " ".join(out.split())
        assert rc == 0, out[-6000:]
        assert f"{WORKER1}: re-admitted (was hardware, gpu_xid: Xid 79 on 0000:1b:00.0" in flat, out[-6000:]
        assert stats[WORKER1]["changed"] == 1 and set(stats) <= {"localhost", WORKER1}, stats
        record = state(WORKER1)
        assert record["record"] is None and record["kmsg_seq"] >= cursor, record
        assert unit(WORKER1, "ray-worker")["ActiveState"] == "active"
        assert unit(WORKER1, "raymetal-health")["ActiveState"] == "active"
        labkit.wait_until(lambda: w1_ip in labkit.alive_ips(lab), 90, 2, f"{WORKER1} ALIVE after its re-admission")
        assert labkit.invocation_ids(lab, [HEAD, WORKER2]) == others

        # The circuit breaker, limit one of the two workers. Worker1's Ray temp dir filled (the real fault,
        # fallocate): quarantined as transient, drained first (it still reaches the head), its place taken in the
        # GCS. Then worker2's: the breaker is open, Ray keeps running there, the metric and the journal say why.
        w2_ip = lab[WORKER2]["lab_fabric_ip"]
        w2_unit = labkit.invocation_ids(lab, [WORKER2])
        labkit.sh(WORKER1, f"fallocate -l 220M {FILL}")
        labkit.wait_until(lambda: unit(WORKER1, "ray-worker")["ActiveState"] in ("inactive", "failed"), 120, 1,
                          f"{WORKER1}'s loop to stop Ray there, its temp dir full")
        record = state(WORKER1)
        assert (record["record"]["class"], record["record"]["check"], record["record"]["drain"]) == (
            "transient", "temp_dir", "drained"), record
        assert record["breaker_slot"] == 0, record
        labkit.sh(WORKER2, f"fallocate -l 220M {FILL}")
        labkit.wait_until(lambda: (state(WORKER2) or {}).get("breaker"), 60, 1, f"{WORKER2}'s loop to find the fault")
        assert state(WORKER2)["record"] is None and state(WORKER2)["breaker"]["check"] == "temp_dir"
        journal = labkit.sh(WORKER2, "journalctl -u raymetal-health --no-pager -o cat").stdout
        assert f"not quarantined, the circuit breaker is open: 1 of 1 quarantine slots held ({WORKER1})" in journal
        assert 'raymetal_health_breaker_open{check="temp_dir"} 1' in labkit.sh(WORKER2, f"cat {PROM}").stdout
        assert labkit.invocation_ids(lab, [WORKER2]) == w2_unit and w2_ip in labkit.alive_ips(lab)
        # Freed: worker2's breaker closes; worker1 is re-admitted by its loop and its place freed.
        labkit.sh(WORKER2, f"rm -f {FILL}")
        labkit.wait_until(lambda: "breaker" not in state(WORKER2), 60, 1, f"{WORKER2}'s breaker to close")
        assert 'raymetal_health_breaker_open{check=""} 0' in labkit.sh(WORKER2, f"cat {PROM}").stdout
        labkit.sh(WORKER1, f"rm -f {FILL}")
        labkit.wait_until(lambda: w1_ip in labkit.alive_ips(lab), 90, 2, f"{WORKER1} re-admitted, its temp dir freed")
        assert "breaker_slot" not in state(WORKER1)
        assert labkit.invocation_ids(lab, [WORKER2]) == w2_unit
    finally:
        ib0_restored(WORKER1, w1_ip)
        for name in (WORKER1, WORKER2):
            labkit.sh(name, f"rm -f {FILL}", check=False)
        # Switched off (the lab's own inventory): stopped, disabled, removed on every node; Ray everywhere.
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    for name in (WORKER1, WORKER2):
        labkit.sh(name, f"umount -l {TMPFS}; rmdir {TMPFS}", check=False)
    assert rc == 0, out[-6000:]
    for name in lab:
        assert unit(name, "raymetal-health")["LoadState"] == "not-found", name
        left = labkit.sh(name, "ls -d " + " ".join(INSTALLED) + f" {PROM} 2>/dev/null", check=False).stdout.split()
        assert left == [], (name, left)
    assert labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}
