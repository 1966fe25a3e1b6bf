"""What crosses from one role to another, checked on the running lab through the real play order.

- GPUDirect RDMA: nvidia_driver decides on nvidia_peermem from the fabric facts, so those must exist when it
  runs. Proved with the deploy's own plays in check mode on the lab nodes, whose sysfs is swapped for recorded
  trees of a DGX (InfiniBand HCAs) and an 8x H100 HGX board: no fact is injected by hand.
- NCCL's settings have one owner (the nccl role, /etc/nccl.conf); a Ray task shows what NCCL would resolve.
- Every port any Ray process listens on is closed to a host outside the cluster, on both networks.
- A restart that a failed run owed is paid by the next run (token rotation interrupted by a failure).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import re
import subprocess
import time

from tests.lab import labkit

P = labkit.LAB_PREFIX
HEAD = f"{P}-head"
TOKEN_ENV = "set -a; . /etc/ray/ray.env; set +a"
# Not under /tmp: Debian 13 mounts a tmpfs there, which hides what `docker cp` writes.
FIXTURE_DIR = "/var/tmp/raymetal-test-fixtures"


def http_code(lab, path, token, on):
    return labkit.sh(on, f"curl -s -m 10 -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {token}' "
                         f"http://{lab[HEAD]['lab_fabric_ip']}:8265{path}").stdout.strip()


# --- GPUDirect RDMA through the real play order --------------------------------------------------------------

def test_the_deploy_plans_nvidia_peermem_on_an_infiniband_gpu_host(cluster, lab):
    for name in lab:
        labkit.sh(name, f"rm -rf {FIXTURE_DIR} && mkdir -p {FIXTURE_DIR}")
        for src, dest in (("tests/fixtures/fabric/dgx/sys", "fabric-sys"),
                          ("tests/fixtures/nvidia/hgx-h100-8gpu/sys", "gpu-sys")):
            subprocess.run(["docker", "cp", str(labkit.ROOT / src), f"{name}:{FIXTURE_DIR}/{dest}"], check=True)
    before = labkit.invocation_ids(lab)
    # The recorded GPUs would also make the monitoring role plan DCGM, which the lab's mirror does not carry
    # (molecule `monitoring` tests that step against stand-in packages): leave it out of this plan.
    extra = {"fabric_sysfs_root": f"{FIXTURE_DIR}/fabric-sys", "nvidia_driver_sysfs_root": f"{FIXTURE_DIR}/gpu-sys",
             "monitoring_dcgm_enabled": False}
    try:
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "--check", "--diff", "-e", json.dumps(extra))
    finally:
        for name in lab:
            labkit.sh(name, f"rm -rf {FIXTURE_DIR}", check=False)
    assert rc == 0, out[-4000:]
    # The driver's plan saw the InfiniBand fabric that the fabric role found in the same run ...
    assert out.count("peermem: true") == len(lab), out[-4000:]
    # ... so every node would load nvidia_peermem at boot ...
    assert out.count("+++ after: /etc/modules-load.d/raymetal-nvidia-peermem.conf") == len(lab)
    assert out.count("+nvidia_peermem") == len(lab)
    # ... and NCCL would use the HCAs (the RDMA branch of nccl.conf).
    assert out.count("+NCCL_IB_DISABLE=0") == len(lab)
    assert out.count("+NCCL_IB_HCA==mlx5_0") == len(lab)
    # Check mode: nothing written, nothing restarted.
    for name in lab:
        assert labkit.sh(name, "test -e /etc/modules-load.d/raymetal-nvidia-peermem.conf", check=False).returncode == 1
    assert labkit.invocation_ids(lab) == before


# --- NCCL settings, as a Ray task sees them --------------------------------------------------------------------

NCCL_SEEN = r'''
import json, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], logging_level="ERROR")

@ray.remote(num_cpus=0)
def seen():
    import os
    env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GLOO_"))}
    conf = {}
    with open("/etc/nccl.conf") as handle:
        for line in handle:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                conf[key] = value
    return {"ip": ray.util.get_node_ip_address(), "env": env, "conf": conf}

refs = [seen.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in ray.nodes() if n["Alive"]]
print("SEEN " + json.dumps(ray.get(refs)))
'''


def nccl_seen_by_ray_tasks(lab):
    """{node ip: what NCCL resolves in a Ray task there: the environment first, then /etc/nccl.conf}."""
    labkit.sh(HEAD, f"cat > /tmp/nccl_seen.py <<'EOF'\n{NCCL_SEEN}\nEOF")
    out = labkit.sh(HEAD, f"{TOKEN_ENV}; cd /tmp && /opt/ray/venv/bin/python /tmp/nccl_seen.py "
                          f"{lab[HEAD]['lab_fabric_ip']}:6379", timeout=180).stdout
    seen = json.loads(out.split("SEEN ", 1)[1])
    return {s["ip"]: ({**s["conf"], **s["env"]}, s["env"]) for s in seen}


def test_ray_tasks_get_nccls_settings_from_the_nccl_role_and_its_overrides(cluster, lab):
    ips = sorted(h["lab_fabric_ip"] for h in lab.values())
    seen = nccl_seen_by_ray_tasks(lab)
    assert sorted(seen) == ips
    for ip, (effective, env) in seen.items():
        # NCCL_* is not in the tasks' environment, where it would override /etc/nccl.conf ...
        assert not [k for k in env if k.startswith("NCCL_")], (ip, env)
        assert env.get("GLOO_SOCKET_IFNAME") == "ib0", (ip, env)
        # ... so what NCCL resolves is the nccl role's file.
        assert effective["NCCL_SOCKET_IFNAME"] == "=ib0", (ip, effective)
        assert effective["NCCL_IB_DISABLE"] == "1", (ip, effective)
    before = labkit.invocation_ids(lab)
    override = {"nccl_extra_env": {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_DEBUG": "INFO"}}
    try:
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", json.dumps(override))
        assert rc == 0, out[-4000:]
        seen = nccl_seen_by_ray_tasks(lab)
        for ip, (effective, _env) in seen.items():
            assert effective["NCCL_SOCKET_IFNAME"] == "=eth0", (ip, effective)
            assert effective["NCCL_DEBUG"] == "INFO", (ip, effective)
        # NCCL reads its file when a job initialises it: no Ray restart for an NCCL change.
        assert labkit.invocation_ids(lab) == before
    finally:
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        assert rc == 0, out[-4000:]
    assert all(e["NCCL_SOCKET_IFNAME"] == "=ib0" for e, _ in nccl_seen_by_ray_tasks(lab).values())


def test_ray_extra_env_refuses_nccl_settings(cluster, lab):
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e",
                                  json.dumps({"ray_extra_env": {"NCCL_SOCKET_IFNAME": "=eth0"}}))
    assert rc != 0
    assert "ray_extra_env sets NCCL_SOCKET_IFNAME" in " ".join(out.split())
    assert "Traceback" not in out


# --- Every listening port, probed from outside the cluster ----------------------------------------------------

def listening(name):
    """(address, port) of every TCP socket listening on the node, except sshd's and loopback-only ones."""
    out = labkit.sh(name, "ss -Hltn").stdout
    found = set()
    for line in out.splitlines():
        local = line.split()[3]
        address, _, port = local.rpartition(":")
        address = address.strip("[]")
        if port == "22" or address.startswith("127.") or address == "::1":
            continue
        found.add((address, int(port)))
    return found


def test_every_port_ray_listens_on_is_closed_to_a_host_outside_the_cluster(cluster, lab):
    probes = []  # (what, ip, port)
    for name, hvars in lab.items():
        sockets = listening(name)
        ports = {port for _, port in sockets}
        # Ray's own listeners are there (the enumeration is not empty by accident): GCS on the head, raylet everywhere.
        assert 6380 in ports, (name, sorted(ports))
        if name == HEAD:
            assert {6379, 8265} <= ports, sorted(ports)
        for address, port in sorted(sockets):
            targets = [hvars["ansible_host"], hvars["lab_fabric_ip"]] if address in ("0.0.0.0", "::") else [address]
            probes += [(f"{name} {address}:{port} reachable at {ip}:{port}", ip, port) for ip in targets]
    # A dropped probe waits for its whole timeout: probe every port at once.
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(lambda probe: labkit.probe_from_controller(probe[1], probe[2]), probes))
    assert len(results) == len(probes) > 3 * len(lab)
    exposed = [what for (what, _, _), result in zip(probes, results) if result == "open"]
    assert not exposed, exposed


# --- A restart owed by a failed run -----------------------------------------------------------------------------

def token_sha(name):
    return labkit.sh(name, "sha256sum /etc/ray/auth_token").stdout.split()[0]


def test_an_interrupted_token_rotation_is_finished_by_the_next_run(cluster, lab):
    controller_token = labkit.LAB_INVENTORY / "credentials" / "ray_auth_token"
    old_token = controller_token.read_text().strip()
    old_sha = hashlib.sha256((old_token + "\n").encode()).hexdigest()
    assert {token_sha(n) for n in lab} == {old_sha}
    controller_token.unlink()

    # 1. A bad input anywhere stops the run before any node changes.
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", '{"firewall_admin_cidrs":["10.0.0.0/33"]}')
    assert rc != 0 and "firewall_admin_cidrs" in out and "Traceback" not in out, out[-3000:]
    assert {token_sha(n) for n in lab} == {old_sha}
    for name in lab:
        assert labkit.sh(name, "test -e /etc/ray/.restart-pending", check=False).returncode == 1

    # 2. A failure after the new token reached every node: the nccl role, which runs after the ray role has
    # written every node's files in the same play, cannot write /etc/nccl.conf on one worker ...
    before = labkit.invocation_ids(lab)
    broken = f"{P}-worker2"
    labkit.sh(broken, "mv /etc/nccl.conf /etc/nccl.conf.saved && mkdir /etc/nccl.conf")
    try:
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    finally:
        labkit.sh(broken, "rmdir /etc/nccl.conf && mv /etc/nccl.conf.saved /etc/nccl.conf")
    assert rc != 0, out[-3000:]
    assert "/etc/nccl.conf is a directory" in " ".join(out.split()), out[-3000:]
    new_token = controller_token.read_text().strip()
    assert new_token != old_token
    assert {token_sha(n) for n in lab} == {hashlib.sha256((new_token + "\n").encode()).hexdigest()}
    assert labkit.invocation_ids(lab) == before  # nothing restarted: Ray still runs with the old token
    for name in lab:
        assert labkit.sh(name, "test -s /etc/ray/.restart-pending", check=False).returncode == 0, name

    # 3. ... is paid by the next clean run, which changes no file itself: every node restarts with the new token.
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out[-4000:]
    after = labkit.invocation_ids(lab)
    assert all(after[n] != before[n] for n in lab), (before, after)
    assert "owed by an earlier run" in out
    for name in lab:
        assert labkit.sh(name, "test -e /etc/ray/.restart-pending", check=False).returncode == 1
    worker = f"{P}-worker1"
    assert http_code(lab, "/api/version", new_token, worker) == "200"
    assert http_code(lab, "/api/version", old_token, worker) in ("401", "403")
    # The GCS refuses the old token too.
    proc = labkit.sh(worker, f"cd /tmp && env -i PATH=/usr/bin:/bin RAY_AUTH_MODE=token RAY_AUTH_TOKEN={old_token} "
                             f"timeout 60 /opt/ray/venv/bin/ray status --address {lab[HEAD]['lab_fabric_ip']}:6379",
                     check=False, timeout=90)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    # And a rerun is quiet again, and as a default run prints no deprecation warning and no traceback; even
    # with -v the token shows nowhere: not in the output, process lists, units or the journal.
    rc, out, recap = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-v")
    assert rc == 0 and recap and all(c["changed"] == 0 for c in recap.values()), recap
    assert "DEPRECATION WARNING" not in out and "Traceback" not in out
    assert new_token not in out
    for name in lab:
        shown = labkit.sh(name, f"ps -eo args; systemctl show {labkit.unit_of(lab, name)}; journalctl --no-pager -o cat").stdout
        assert new_token not in shown, name


# --- No write before every check of every role ------------------------------------------------------------------

def test_a_bad_ray_setting_stops_the_run_before_any_role_writes(cluster, lab):
    name = f"{P}-worker1"
    limits = "/etc/security/limits.d/90-raymetal-memlock.conf"
    labkit.sh(name, f"mv {limits} {limits}.test-saved")
    try:
        # Ray's preflight fails (object store larger than /dev/shm; resource isolation demanded on the lab's
        # cgroup v1 nodes); the fabric role, which comes first and writes the memlock file, must not have written it.
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e",
                                         '{"ray_object_store_memory": 1099511627776, "ray_resource_isolation": true}')
        assert rc != 0 and "ray_object_store_memory" in out and "Traceback" not in out, out[-3000:]
        flat = " ".join(out.split())
        for host in lab:
            assert re.search(rf"{host}: .*ray_resource_isolation is true but this node cannot isolate Ray's processes: "
                             r"cgroup v1 \(or hybrid\) at /sys/fs/cgroup", flat), (host, out[-3000:])
        assert labkit.sh(name, f"test -e {limits}", check=False).returncode == 1, "written before the checks passed"
    finally:
        # Put the file back as the deploy wrote it (cheaper than another site.yml run).
        labkit.sh(name, f"mv {limits}.test-saved {limits}")


# --- The unit refuses to start Ray on a broken node -------------------------------------------------------------

def journal_since(name, unit, cursor):
    return labkit.sh(name, f"journalctl -u {unit} --no-pager -o cat --after-cursor='{cursor}'").stdout


def journal_cursor(name):
    return labkit.sh(name, "journalctl -n 0 --show-cursor --no-pager | tail -1").stdout.split("cursor: ", 1)[1].strip()


def test_ray_does_not_start_when_its_address_left_the_fabric_interface(cluster, lab):
    """The worker's fabric NIC renamed (ib0 gone): Ray's unit refuses to start on the wrong NIC, and starts again by
    itself once ib0 is back. What is tested is the unit's own refusal, so the node health loop is stopped on that
    worker meanwhile: it sees the same fault (ib0 gone: fabric_link) and, when one of its rounds fell inside the
    window, quarantined the worker and stopped Ray's unit, cancelling the very start whose refusal this test reads
    (lab, 2026-12-02; CI's run of fe8a403 ended red on that quarantine). tests/lab/test_health.py makes the same
    fault with the loop on."""
    name = f"{P}-worker2"
    ip = lab[name]["lab_fabric_ip"]
    cursor = journal_cursor(name)
    labkit.sh(name, "systemctl stop raymetal-health")
    try:
        # What a reboot that names the NIC differently does (seen in the lab: eth1 instead of ib0).
        labkit.sh(name, "systemctl stop ray-worker && ip link set ib0 down && ip link set ib0 name fab9 "
                        "&& ip link set fab9 up && systemctl start ray-worker", check=False)
        try:
            labkit.wait_until(lambda: "refusing to start Ray" in journal_since(name, "ray-worker", cursor), 60,
                              what="the refusal in the journal")
            log = journal_since(name, "ray-worker", cursor)
            assert f"fabric interface ib0 does not exist; Ray must bind to {ip}" in log, log
            assert labkit.sh(name, "pgrep -x raylet", check=False).returncode == 1  # no Ray on the wrong NIC
        finally:
            labkit.sh(name, "ip link set fab9 down && ip link set fab9 name ib0 && ip link set ib0 up")
    finally:
        labkit.sh(name, "systemctl start raymetal-health")
    # The NIC is back: systemd's next retry starts Ray and the node rejoins by itself.
    labkit.wait_until(lambda: ip in labkit.alive_ips(lab), 180, interval=3, what=f"{name} alive again")
    # The loop, running again with ib0 back, holds nothing against the worker.
    held = labkit.health_record(name)
    assert held is None, held


def test_an_unreadable_token_stops_the_restart_loop_with_a_clear_message(cluster, lab):
    name = f"{P}-worker1"
    cursor = journal_cursor(name)
    labkit.sh(name, "chmod 000 /etc/ray/auth_token && systemctl restart ray-worker")
    try:
        labkit.wait_until(lambda: labkit.sh(name, "systemctl is-failed ray-worker", check=False).stdout.strip()
                          == "failed", 90, what="ray-worker failed for good")
        restarts = labkit.sh(name, "systemctl show -p NRestarts --value ray-worker").stdout.strip()
        log = journal_since(name, "ray-worker", cursor)
        assert "cannot read the Ray token file /etc/ray/auth_token as user ray" in log, log
        assert "Traceback" not in log
        # No loop: still failed, no more restarts, after two RestartSec periods.
        time.sleep(35)
        assert labkit.sh(name, "systemctl is-failed ray-worker", check=False).stdout.strip() == "failed"
        assert labkit.sh(name, "systemctl show -p NRestarts --value ray-worker").stdout.strip() == restarts
    finally:
        labkit.sh(name, "chmod 600 /etc/ray/auth_token")
    # The next deploy would also fix the mode; here the operator restarts the unit by hand.
    labkit.sh(name, "systemctl restart ray-worker")
    labkit.wait_until(lambda: lab[name]["lab_fabric_ip"] in labkit.alive_ips(lab), 180, interval=3, what=f"{name} alive")
