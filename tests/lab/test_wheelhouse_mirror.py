"""The wheelhouse mirror (issue 16): the controller sends the wheelhouse to one host, the others install from it.

The session's deploy (the `cluster` fixture, a fresh lab) runs with the lab's defaults: the wheelhouse from
the controller, ray_wheelhouse_fanout=mirror, the head as the mirror host, ray_venv_fanout on. Read on the
nodes afterwards: only the head holds the wheelhouse; the head installed with pip from its own copy and packed
its venv; every other node fetched that pack, whole, from the head's nginx over the fabric (its access log in
the head's journal names the fetching address of each request) instead of running pip; the distribution's
nginx service stays stopped; the mirror's port answers cluster members only. No site.yml run of its own: the
checks read what the session's deploy (and any later install through the mirror on this lab, such as
test_upgrade.py's) left. The other way through the mirror, every node's pip fetching the wheels
(ray_venv_fanout=false), is test_lifecycle.py's redeploy.
"""

from __future__ import annotations

import re

import pytest

from tests.lab import labkit

E2E_LAB = 2

HEAD = labkit.HEAD
MIRROR_PORT = 8480
WHEELHOUSE = "/var/cache/raymetal/wheelhouse"
PACKS = f"{WHEELHOUSE}/venvs"


def test_only_the_mirror_host_received_the_wheelhouse_and_every_other_node_unpacked_its_venv(cluster, lab):
    head_wheels = set(labkit.sh(HEAD, f"ls {WHEELHOUSE}").stdout.split())
    nccl_wheel = [w for w in head_wheels if w.startswith("nvidia_nccl_cu12-")]
    assert nccl_wheel, sorted(head_wheels)
    # The head's pack of the venv it last installed through the mirror, the only one kept: 2.60.0's after the
    # session's deploy, 2.59.0's after test_upgrade.py's (which finds 2.60.0's venvs still there).
    files = labkit.sh(HEAD, f"ls {PACKS}").stdout.split()
    packs = [name for name in files if not name.endswith(".sha256")]
    assert len(packs) == 1 and re.match(r"ray-2\.(60|59)\.0-[0-9a-f]{16}\.tar(\.gz)?$", packs[0]), files
    # Beside it, its sha256 as taken while it was written (what the controller hands the other nodes).
    assert sorted(files) == sorted(packs + [packs[0] + ".sha256"]), files
    digest = labkit.sh(HEAD, f"cat {PACKS}/{packs[0]}.sha256").stdout.split()
    assert digest == labkit.sh(HEAD, f"sha256sum {PACKS}/{packs[0]}").stdout.split()[:1], digest
    size = int(labkit.sh(HEAD, f"stat -c %s {PACKS}/{packs[0]}").stdout)
    log = labkit.mirror_access_log()
    workers = [name for name in lab if name != HEAD]
    print(f"\nthe mirror on {HEAD} served its venv ({size / 1e6:.0f} MB) "
          f"{sum(1 for _, _, path, status, _ in log if path == f'/venvs/{packs[0]}' and status == '200')} times")
    for name in workers:
        # The controller never sent the wheelhouse here...
        present = labkit.sh(name, f"test -e {WHEELHOUSE} && echo present || echo absent").stdout.strip()
        assert present == "absent", f"{name} holds {WHEELHOUSE}: the controller shipped the wheelhouse to it"
        # ... it took the head's pack, whole, over the fabric.
        mine = [got for ip, _, path, status, got in log
                if ip == lab[name]["lab_fabric_ip"] and path == f"/venvs/{packs[0]}" and status == "200"]
        assert mine and mine[-1] == size, (name, mine, size)
        # What it runs is what the head has: Ray and NCCL in the venv, the same install record.
        versions = labkit.sh(name, "/opt/ray/venv/bin/python -c \"import importlib.metadata as m; "
                                   "print(m.version('ray'), m.version('nvidia-nccl-cu12'))\"").stdout.split()
        assert versions == ["2.60.0", nccl_wheel[0].split("-")[1]], (name, versions)
        record = "cat /opt/ray/venv-2.60.0/.raymetal-install.json"
        assert labkit.sh(name, record).stdout == labkit.sh(HEAD, record).stdout, name
        # Nothing of the unpack is left beside the venvs.
        left = [e for e in labkit.sh(name, "ls -A /opt/ray").stdout.split() if e.endswith((".unpack", ".gz"))]
        assert left == [], (name, left)
    # The head installed from its own directory, not over HTTP.
    assert lab[HEAD]["lab_fabric_ip"] not in {ip for ip, *_ in log}, sorted({ip for ip, *_ in log})


def test_the_mirror_runs_as_its_own_unit_and_the_distributions_nginx_stays_stopped(cluster, lab):
    state = labkit.sh(HEAD, "systemctl is-active raymetal-wheelhouse nginx; systemctl is-enabled raymetal-wheelhouse "
                            "nginx; ss -Hltn", check=False).stdout.split("\n")
    assert state[:4] == ["active", "inactive", "enabled", "disabled"], state
    listening = {line.split()[3] for line in state[4:] if line.strip()}
    assert f"{lab[HEAD]['lab_fabric_ip']}:{MIRROR_PORT}" in listening, sorted(listening)
    assert not any(addr.endswith(":80") for addr in listening), sorted(listening)


@pytest.fixture()
def outsider(lab):
    """A container on the fabric network that is not in the inventory."""
    with labkit.outsider_on_fabric(lab, "mirror-outsider", 201) as container:
        yield container


def test_the_mirror_port_answers_cluster_members_only(cluster, lab, outsider):
    head_ib = lab[HEAD]["lab_fabric_ip"]
    probes = {
        "worker1 (member, fabric)": labkit.probe_from(labkit.WORKER1, head_ib, MIRROR_PORT),
        "outsider on the fabric": labkit.probe_from(outsider, head_ib, MIRROR_PORT),
        "controller (fabric bridge)": labkit.probe_from_controller(head_ib, MIRROR_PORT),
        "worker1 to the head's management address": labkit.probe_from(labkit.WORKER1, lab[HEAD]["ansible_host"],
                                                                       MIRROR_PORT),
    }
    print(f"\nmirror port {MIRROR_PORT} on {HEAD}: {probes}")
    assert probes == {
        "worker1 (member, fabric)": "open",
        # The firewall drops non-members on the fabric.
        "outsider on the fabric": "timeout",
        "controller (fabric bridge)": "timeout",
        # Dropped there too (nginx listens on the fabric address only anyway).
        "worker1 to the head's management address": "timeout",
    }, probes
