"""The node health loop on the lab (roles/health, issue 36): a worker off the fabric is quarantined and comes back.

The lab runs the health loop on every node (its inventory sets health_enabled; the loop is off by default for a site);
this module deploys it with a short interval (a copy of the lab inventory), takes ib0 down on a worker (the real fault: the link Ray's address is on),
and sees that worker's own loop drain and stop Ray there, keep the record and the metric, the head's Alertmanager
page a webhook within 30 s, while every other node keeps its raylet; then brings ib0 up and sees the worker ALIVE in the cluster again with nobody running anything.
Then a GPU fault the loop finds itself (the recorded HGX H100 tree's eight GPUs, a stand-in nvidia-smi, the
driver's GPU directory without one of them and its Xid 79 in a kernel log file): quarantined as hardware; a plain
deploy leaves it, Ray stays stopped there, nothing changes on it, the run names it quarantined; playbooks/readmit.yml
refuses it while the GPU is lost; repaired, the loop still does not re-admit it, and readmit.yml does. Then the circuit breaker (a limit of one worker): each
worker's Ray temp dir (a tmpfs of its own) filled with fallocate, the first worker quarantined as transient, the
second kept running with the breaker's metric and reason; both freed, the first re-admitted by its loop; the
second, quarantined for a lost GPU and removed with playbooks/remove-node.yml, gives its place back at once. It ends
with a deploy with health_enabled false: the loop is stopped, disabled and removed everywhere; then the lab's own
inventory starts it again, and the lab is as the other tests expect it.
"""

from __future__ import annotations

import contextlib
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
# The head is the monitoring host: its Alertmanager sends to a webhook recorder on its loopback (a pager's stand-in).
# A worker off the fabric cannot be scraped for its own quarantine metric (node_exporter answers on the fabric), so
# the alert that reaches people first is RayNodeDown; a 5 s scrape and evaluation interval (the lab's is the role's
# 15 s), a 10 s window (the lab's is 20 s, a site's longer) and no batching (group_wait 1 s) make it due within the
# 30 s the issue sets from the fault.
HEAD_VARS = dict(HEALTH_VARS, monitoring_scrape_interval="5s", monitoring_alert_node_down_for="10s",
                 monitoring_alertmanager_group_wait="1s",
                 monitoring_alertmanager_group_interval="10s",
                 monitoring_alertmanager_webhooks=[f"http://127.0.0.1:{labkit.WEBHOOK_PORT}/"])
FILL = f"{TMPFS}/raymetal-test-fill"
STATE = labkit.HEALTH_STATE
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


# The eight H100s of the recorded HGX H100 tree (NVIDIA 0x2330, class 0x0302), and the one that falls off the bus.
H100_TREE = labkit.ROOT / "tests" / "fixtures" / "nvidia" / "hgx-h100-8gpu" / "sys" / "bus" / "pci" / "devices"
H100S = sorted(d.name for d in H100_TREE.iterdir()
               if (d / "vendor").read_text().strip() == "0x10de" and (d / "class").read_text().strip() == "0x030200")
LOST_GPU = "0000:3a:00.0"
# Where a worker's stand-ins live: nvidia-smi, the driver's GPU directory, the kernel log.
GPU_DIR = "/srv/raymetal-test-gpu"
# The recorded H200's answer to the health query (tests/fixtures/nvidia/recorded-h200-vm/smi-health.csv) after
# index, bus ID and UUID: ECC on, no error, no pending retirement or remapping.
SMI_HEALTHY = "Enabled, 0, 0, [N/A], No, No, 0"
# Answers the health query (raymetal_health.HEALTH_QUERY) with health.csv; any other call fails.
SMI_STAND_IN = """#!/bin/sh
case "$1" in --query-gpu=index,pci.bus_id,uuid,ecc.mode.current,ecc.errors.uncorrected.volatile.total,\
ecc.errors.uncorrected.aggregate.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure,\
remapped_rows.uncorrectable) cat GPU_DIR/health.csv;; *) exit 9;; esac
""".replace("GPU_DIR", GPU_DIR)


def write(name, path, text):
    labkit.sh(name, f"cat > {path} <<'RAYMETAL_EOF'\n{text}RAYMETAL_EOF")


def gpu_fault(name, lost):
    """Worker `name` told it has H100S: the loop's configuration points at stand-ins (with the loop stopped while
    it changes). lost: the driver no longer holds LOST_GPU, nvidia-smi omits it, and the kernel log gets its Xid 79
    (a record after the loop's kernel log cursor). Not lost: the driver holds all eight again, nvidia-smi lists them."""
    held = [gpu for gpu in H100S if not (lost and gpu == LOST_GPU)]
    labkit.sh(name, "systemctl stop raymetal-health")
    labkit.sh(name, f"mkdir -p {GPU_DIR}/gpus && rm -rf {GPU_DIR}/gpus/* && cd {GPU_DIR}/gpus && mkdir {' '.join(held)}"
                    f" && touch {GPU_DIR}/kmsg")
    write(name, f"{GPU_DIR}/health.csv",
          "".join(f"{i}, 0000{gpu}, GPU-00000000-0000-0000-0000-{i:012d}, {SMI_HEALTHY}\n" for i, gpu in enumerate(held)))
    write(name, f"{GPU_DIR}/nvidia-smi", SMI_STAND_IN)
    labkit.sh(name, f"chmod 0755 {GPU_DIR}/nvidia-smi")
    if lost:
        seq = max(state(name)["kmsg_seq"], 0) + 1000
        labkit.sh(name, f"echo \"3,{seq},{int(time.time()) * 1000000},-;NVRM: Xid (PCI:{LOST_GPU[:-2]}): 79, "
                        f"pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\" >> {GPU_DIR}/kmsg")
    config = json.loads(labkit.sh(name, "cat /etc/raymetal/health.json").stdout)
    config.update(gpus=H100S, nvidia_smi=f"{GPU_DIR}/nvidia-smi", nvidia_proc=f"{GPU_DIR}/gpus",
                  kernel_log=f"{GPU_DIR}/kmsg")
    write(name, "/etc/raymetal/health.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    labkit.sh(name, "systemctl start raymetal-health")


def places(lab):
    """{place: worker} of the circuit breaker's places in the GCS's key-value store, read on the head as the loop's
    helper reads them (Ray's GCS client, the token from its file)."""
    script = ("import json; from ray._raylet import GcsClient\n"
              f"c = GcsClient(address='{lab[HEAD]['lab_fabric_ip']}:6379')\n"
              "found = {}\n"
              "for i in range(8):\n"
              "    raw = c.internal_kv_get(b'raymetal/health/quarantine/%d' % i, b'raymetal')\n"
              "    if raw is not None:\n"
              "        found[i] = json.loads(raw)['host']\n"
              "print(json.dumps(found))\n")
    out = labkit.sh(HEAD, f"cd /tmp && RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/etc/ray/auth_token "
                          f"/opt/ray/venv/bin/python - <<'RAYMETAL_EOF'\n{script}RAYMETAL_EOF").stdout
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def changed_tasks(out, host):
    """The tasks a playbook run's output shows as changed on host ("role : task name"), in order."""
    tasks, task = [], None
    for line in out.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith(f"changed: [{host}]"):
            tasks.append(task)
    return tasks


def round_at(name):
    """When the node's loop last ran a round (its metric), 0 before the first."""
    prom = labkit.sh(name, f"cat {PROM}", check=False).stdout
    return next((float(line.split()[-1]) for line in prom.splitlines()
                 if line.startswith("raymetal_health_round_timestamp_seconds")), 0)


def ib0_restored(name, ip):
    """ib0 up with its fabric address (the test's own repair: a fault test must never leave the lab broken)."""
    labkit.sh(name, f"ip link set ib0 up; ip -4 -o address show dev ib0 | grep -qw {ip} || "
                    f"ip address add {ip}/24 dev ib0", check=False)


def test_a_worker_off_the_fabric_is_quarantined_and_comes_back_by_itself(cluster, lab, tmp_path, health_faults):
    w1_ip = lab[WORKER1]["lab_fabric_ip"]
    inventory = labkit.inventory_copy(tmp_path, {name: HEAD_VARS if name == HEAD else WORKER_VARS for name in lab})
    recorder = contextlib.ExitStack()
    recorder.enter_context(labkit.webhook_recorder(HEAD))
    for name in (WORKER1, WORKER2):
        labkit.sh(name, f"mkdir -p {TMPFS} && mount -t tmpfs -o size=320m,mode=1770 tmpfs {TMPFS}")
    passed = False
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
        fault, fault_at = time.monotonic(), time.time()
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
        # The webhook got an alert firing for the worker within 30 s of the fault.
        paged = labkit.wait_until(lambda: labkit.webhook_first_firing(HEAD, WORKER1, after=fault_at), 60, 1,
                                  f"an alert for {WORKER1} at the webhook")
        assert paged[0] - fault_at <= 30, (paged, "seconds after the fault:", paged[0] - fault_at)
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
              f"{gone_after:.1f} s; -> {', '.join(paged[1])} at the webhook: {paged[0] - fault_at:.1f} s; "
              f"ib0 up -> ALIVE again: {alive_after:.1f} s")

        # A GPU fault, found by the loop itself: worker1 is told it has the eight H100s of the recorded HGX tree
        # (tests/fixtures/nvidia/hgx-h100-8gpu), a stand-in nvidia-smi answers the health query for the seven the
        # driver still holds, the driver's GPU directory lacks the eighth, and the kernel log (a file in
        # /dev/kmsg's record format: the lab's /dev/kmsg is the host's) has its Xid 79. Quarantined as hardware:
        # drained, Ray stopped.
        gpu_fault(WORKER1, lost=True)
        labkit.wait_until(lambda: unit(WORKER1, "ray-worker")["ActiveState"] in ("inactive", "failed"), 60, 1,
                          f"{WORKER1}'s loop to stop Ray there for the lost GPU")
        record = state(WORKER1)["record"]
        assert (record["state"], record["class"], record["stopped"], record["drain"]) == (
            "quarantined", "hardware", True, "drained"), record
        assert record["check"] in ("gpu_lost", "gpu_xid"), record
        assert LOST_GPU[:10] in record["finding"] and "Xid 79" in record["finding"], record
        assert f'raymetal_health_quarantined{{class="hardware",check="{record["check"]}"}} 1' in labkit.sh(
            WORKER1, f"cat {PROM}").stdout
        labkit.wait_until(lambda: w1_ip not in labkit.alive_ips(lab), 90, 2, f"the head to see {WORKER1} gone")
        check, finding = record["check"], " ".join(record["finding"].split())[:60]
        # A plain deploy does not undo it: Ray stays stopped there, the run names it quarantined, and its record of
        # the last deploy is not rewritten (so the next deploy reads the quarantine again instead of waiting for the
        # worker on the fast path). The one change there is the loop's configuration, written back without the
        # test's stand-ins (they are no inventory setting), and the loop's restart with it; they go back after.
        applied_before = labkit.sh(WORKER1, "stat -c %Y /var/lib/raymetal/applied.json").stdout
        rc, out, stats = labkit.run_playbook("site.yml", inventory)
        assert rc == 0, out[-6000:]
        flat = " ".join(out.split())
        assert (f"{WORKER1}: quarantined by the health loop (hardware, {check}): {finding}" in flat
                and "A hardware fault is never re-admitted by the loop" in flat), out[-6000:]
        assert "Left out of the cluster by this run" in flat, out[-6000:]
        assert changed_tasks(out, WORKER1) == [
            "health : Install the loop, the checks it shares with the node checks, its configuration and its unit",
            "health : Restart the health loop"], out[-6000:]
        assert unit(WORKER1, "ray-worker")["ActiveState"] == "inactive"
        assert state(WORKER1)["record"]["class"] == "hardware"
        assert labkit.sh(WORKER1, "stat -c %Y /var/lib/raymetal/applied.json").stdout == applied_before
        gpu_fault(WORKER1, lost=True)
        assert labkit.invocation_ids(lab, [HEAD, WORKER2]) == others
        # status.yml names it quarantined, with the record's class and check, not missing, and fails (2, all that
        # ansible-playbook has); `python -m raymetal status` tells the case apart by its exit status, 3.
        rc, out, _ = labkit.run_playbook("playbooks/status.yml", inventory)
        flat = " ".join(out.split())
        assert rc == 2 and "1 worker(s) quarantined by the health loop" in flat, out[-6000:]
        assert f"{WORKER1}: quarantined by the health loop (hardware, {check})" in flat, out[-6000:]
        assert "not an ALIVE Ray node:" not in flat and "Out of the cluster (Ray stopped there" in flat, out[-6000:]
        cli = subprocess.run([sys.executable, "-m", "raymetal", "status", "-i", str(inventory)], capture_output=True,
                             text=True, cwd=labkit.ROOT, env=labkit.ansible_env(), timeout=300)
        assert cli.returncode == 3, (cli.returncode, cli.stdout[-3000:], cli.stderr[-3000:])
        assert f"{WORKER1}: quarantined by the health loop (hardware, {check})" in cli.stdout, cli.stdout

        # The operator's re-admission (playbooks/readmit.yml). Refused while the GPU is still lost: the record and
        # Ray's stop are kept.
        cursor = state(WORKER1)["kmsg_seq"]
        rc, out, _ = labkit.run_playbook("playbooks/readmit.yml", inventory, "-e", f"raymetal_readmit_hosts={WORKER1}")
        flat = " ".join(out.split())
        assert rc != 0 and f"{WORKER1} stays quarantined" in flat, out[-6000:]
        assert f"GPU {LOST_GPU[:10]}" in flat.split("stays quarantined")[1], out[-6000:]
        assert state(WORKER1)["record"]["class"] == "hardware"
        assert unit(WORKER1, "ray-worker")["ActiveState"] == "inactive"
        assert unit(WORKER1, "raymetal-health")["ActiveState"] == "active"
        # Repaired (the driver holds the eighth GPU again, nvidia-smi lists it): the loop does not re-admit a
        # hardware quarantine by itself, however many passing rounds it runs.
        gpu_fault(WORKER1, lost=False)
        repaired = time.time()
        labkit.wait_until(lambda: round_at(WORKER1) > repaired + (HEALTH_VARS["health_readmit_passes"] + 1) * 5, 90, 2,
                          f"{WORKER1}'s loop to run more passing rounds than a re-admission takes")
        assert state(WORKER1)["record"]["class"] == "hardware"
        assert unit(WORKER1, "ray-worker")["ActiveState"] == "inactive"
        # The operator's re-admission now: admitted, the record cleared with the kernel log cursor kept, Ray
        # started, ALIVE at the head.
        rc, out, stats = labkit.run_playbook("playbooks/readmit.yml", inventory, "-e", f"raymetal_readmit_hosts={WORKER1}")
        flat = " ".join(out.split())
        assert rc == 0, out[-6000:]
        assert f"{WORKER1}: re-admitted (was hardware, {check}: {finding[:40]}" in flat, out[-6000:]
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

        # A quarantined worker removed from the cluster (playbooks/remove-node.yml) gives its place back at once:
        # otherwise it would hold it for good (its loop stops with it), and with the lab's limit of one no later
        # fault anywhere would be quarantined. Worker2 quarantined (its GPU lost, as worker1's was) holds place 0;
        # removed, its loop is stopped and disabled and the GCS has no place left. The final deploy brings it back.
        # (tests/lab/test_drain.py removes a worker short of room in its temp dir.)
        gpu_fault(WORKER2, lost=True)
        labkit.wait_until(lambda: (state(WORKER2) or {}).get("breaker_slot") == 0, 60, 1,
                          f"{WORKER2} quarantined in place 0")
        assert places(lab) == {0: WORKER2}
        rc, out, stats = labkit.run_playbook("playbooks/remove-node.yml", inventory, "-e",
                                             f"raymetal_remove_hosts={WORKER2}")
        assert rc == 0, out[-6000:]
        assert stats[WORKER2]["failed"] == 0 and "Free this node's place in the circuit breaker" in out
        assert places(lab) == {}
        assert (unit(WORKER2, "raymetal-health")["ActiveState"], unit(WORKER2, "raymetal-health")["UnitFileState"]) == (
            "inactive", "disabled")
        assert "breaker_slot" not in state(WORKER2)
        passed = True
    finally:
        recorder.close()
        ib0_restored(WORKER1, w1_ip)
        for name in (WORKER1, WORKER2):
            labkit.sh(name, f"rm -f {FILL}; rm -rf {GPU_DIR}", check=False)
        # Switched off: stopped, disabled, removed on every node; Ray everywhere.
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "health_enabled=false")
        for name in (WORKER1, WORKER2):
            labkit.sh(name, f"umount -l {TMPFS}; rmdir {TMPFS}", check=False)
        # The loop's switch-off keeps its state (a quarantine is remembered if it is switched on again): this test's
        # records go, so that the lab is as before it (and a failed run's record cannot hold a node at the next).
        for name in lab:
            labkit.sh(name, f"rm -rf {STATE.rsplit('/', 1)[0]}", check=False)
        if not passed:
            # Failed above: the lab's own inventory again (the loop on every node), so that the tests after this
            # one do not fail for it (run22: a failed check here left the loop off and a tmpfs over Ray's temp dir).
            labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out[-6000:]
    for name in lab:
        assert unit(name, "raymetal-health")["LoadState"] == "not-found", name
        left = labkit.sh(name, "ls -d " + " ".join(INSTALLED) + f" {PROM} 2>/dev/null", check=False).stdout.split()
        assert left == [], (name, left)
    assert labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}
    # The lab's own inventory: the loop on every node again, at its default interval, for the tests after this one.
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out[-6000:]
    for name in lab:
        assert unit(name, "raymetal-health")["ActiveState"] == "active", name
