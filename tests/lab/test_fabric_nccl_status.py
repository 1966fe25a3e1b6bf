"""fabric_facts, NCCL and the status playbook on the lab's real nodes."""

from __future__ import annotations

import json
import subprocess

from raymetal.runner import status
from tests.lab import labkit

WORKER = labkit.WORKER1


def adhoc(host, module, args=""):
    """Run one module on one lab host; (ok, result dict)."""
    cmd = [str(labkit.VENV_BIN / "ansible"), "-i", str(labkit.LAB_INVENTORY), host, "-o", "-m", module]
    if args:
        cmd += ["-a", args]
    proc = subprocess.run(cmd, cwd=labkit.ROOT, env=labkit.ansible_env(), capture_output=True, text=True, timeout=120)
    line = next(l for l in proc.stdout.splitlines() if l.startswith(host))
    return " | SUCCESS" in line, json.loads(line.split("=>", 1)[1])


def test_fabric_facts_picks_ib0_when_told(lab):
    ok, result = adhoc(WORKER, "fabric_facts", "interface=ib0 require_rdma=false")
    assert ok, result
    fabric = result["ansible_facts"]["fabric"]
    assert fabric["interface"] == "ib0"
    assert fabric["address"] == lab[WORKER]["lab_fabric_ip"]
    assert fabric["prefix"] == 24
    assert fabric["kind"] == "ethernet"  # the lab's ib0 is Ethernet, and the module says so
    assert fabric["hcas"] == []
    assert {c["name"] for c in fabric["candidates"]} >= {"ib0", "eth0"}


def test_fabric_facts_fails_clearly_without_rdma_or_a_choice(lab):
    ok, result = adhoc(WORKER, "fabric_facts")
    assert not ok
    msg = result["msg"]
    assert "ib0" in msg and "eth0" in msg, msg
    assert "require_rdma" in msg, msg
    assert "Traceback" not in json.dumps(result)


def test_nccl_is_installed_verified_and_bound_to_the_fabric(cluster, lab):
    for name in lab:
        conf = labkit.sh(name, "cat /etc/nccl.conf").stdout.splitlines()
        assert "NCCL_SOCKET_IFNAME==ib0" in conf, (name, conf)
        assert "NCCL_IB_DISABLE=1" in conf, (name, conf)  # no RDMA in the lab
        version = labkit.sh(
            name,
            "/opt/ray/venv/bin/python -c \"import ctypes, glob; "
            "lib = ctypes.CDLL(glob.glob('/opt/ray/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2')[0]); "
            "v = ctypes.c_int(); assert lib.ncclGetVersion(ctypes.byref(v)) == 0; print(v.value)\"",
        ).stdout.strip()
        assert version == "23203", (name, version)


def test_status_names_a_stopped_worker_and_sees_it_return(cluster, lab):
    name = labkit.WORKER2
    labkit.sh(name, "systemctl stop ray-worker")
    try:
        facts = labkit.wait_until(
            lambda: (lambda f: f if f["nodes_alive"] == 2 else None)(status(str(labkit.LAB_INVENTORY))),
            120, interval=5, what="status to see 2 alive nodes",
        )
        assert facts["missing"] == [name], facts["missing"]
    finally:
        labkit.sh(name, "systemctl start ray-worker")
    facts = labkit.wait_until(
        lambda: (lambda f: f if f["nodes_alive"] == 3 else None)(status(str(labkit.LAB_INVENTORY))),
        180, interval=5, what="the worker to rejoin",
    )
    assert facts["missing"] == []
