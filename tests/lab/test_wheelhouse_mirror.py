"""The wheelhouse mirror (issue 16): the controller sends the wheelhouse to one host, the others install from it.

The session's deploy (the `cluster` fixture, a fresh lab) runs with the lab's defaults: the wheelhouse from
the controller, ray_wheelhouse_fanout=mirror, the head as the mirror host. Read on the nodes afterwards: only
the head holds the wheelhouse; every other node's pip fetched Ray's and NCCL's wheels from the head's nginx
over the fabric (its access log in the head's journal names the fetching address of each request); the
distribution's nginx service stays stopped; the mirror's port answers cluster members only. No site.yml run
of its own: the checks read what the session's deploy (and any later install through the mirror on this
lab, such as test_upgrade.py's) left.
"""

from __future__ import annotations

import re

import pytest

from tests.lab import labkit

E2E_LAB = 2

HEAD = labkit.HEAD
MIRROR_PORT = 8480
WHEELHOUSE = "/var/cache/raymetal/wheelhouse"
# The mirror's access log (syslog tag raymetal_wheelhouse): 'ADDRESS CONNECTION "GET /FILE HTTP/1.1" STATUS BYTES'.
ACCESS = re.compile(r'^(?P<ip>\d+\.\d+\.\d+\.\d+) (?P<conn>\d+) "GET /(?P<file>\S*) HTTP/[\d.]+" '
                    r'(?P<status>\d+) (?P<bytes>\d+)')


def access_log():
    """The mirror's answered GETs in order: [(IP, connection, path, status, bytes)]."""
    log = labkit.sh(HEAD, "journalctl -t raymetal_wheelhouse -o cat --no-pager").stdout
    return [(m["ip"], m["conn"], "/" + m["file"], m["status"], int(m["bytes"]))
            for m in (ACCESS.match(line.strip()) for line in log.splitlines()) if m]


def fetched(lab):
    """{fetching IP: {wheel file name: bytes}} of the GETs the mirror answered with 200."""
    got = {}
    for ip, _, path, status, size in access_log():
        if status == "200" and path.endswith(".whl"):
            got.setdefault(ip, {})[path[1:]] = size
    return got


def pip_runs(ip):
    """The wheels each pip run of one node fetched: one pip run reads them all over one keep-alive connection."""
    runs = {}
    for who, conn, path, status, _ in access_log():
        if who == ip and status == "200" and path.endswith(".whl"):
            runs.setdefault(conn, []).append(path[1:])
    return list(runs.values())


def test_only_the_mirror_host_received_the_wheelhouse_and_every_other_node_installed_from_it(cluster, lab):
    head_wheels = set(labkit.sh(HEAD, f"ls {WHEELHOUSE}").stdout.split())
    ray_wheel = [w for w in head_wheels if re.match(r"ray-2\.60\.0-.*\.whl$", w)]
    nccl_wheel = [w for w in head_wheels if w.startswith("nvidia_nccl_cu12-")]
    assert ray_wheel and nccl_wheel, sorted(head_wheels)
    got = fetched(lab)
    workers = [name for name in lab if name != HEAD]
    print(f"\nthe mirror on {HEAD} served {sum(len(v) for v in got.values())} wheels to "
          f"{', '.join(f'{ip} ({len(v)}, {sum(v.values()) / 1e6:.0f} MB)' for ip, v in sorted(got.items()))}")
    for name in workers:
        # The controller never sent the wheelhouse here...
        present = labkit.sh(name, f"test -e {WHEELHOUSE} && echo present || echo absent").stdout.strip()
        assert present == "absent", f"{name} holds {WHEELHOUSE}: the controller shipped the wheelhouse to it"
        # ... its pip took Ray and NCCL, whole, from the head's mirror.
        mine = got.get(lab[name]["lab_fabric_ip"], {})
        # The mirror holds Ray for each Python of the site (Debian 12's and 13's): this node's pip chose its own.
        tag = labkit.sh(name, "python3 -c 'import sys; print(\"cp%d%d\" % sys.version_info[:2])'").stdout.strip()
        wheel = [w for w in ray_wheel if f"-{tag}-{tag}-" in w]
        assert len(wheel) == 1, (name, tag, sorted(ray_wheel))
        size = int(labkit.sh(HEAD, f"stat -c %s {WHEELHOUSE}/{wheel[0]}").stdout)
        assert mine.get(wheel[0]) == size, (name, sorted(mine))
        assert not [w for w in ray_wheel if w != wheel[0] and w in mine], (name, sorted(mine))
        assert nccl_wheel[0] in mine, (name, sorted(mine))
        # Ray and NCCL came in one pip run (over one connection), not two.
        runs = [run for run in pip_runs(lab[name]["lab_fabric_ip"]) if wheel[0] in run]
        assert runs and all(nccl_wheel[0] in run for run in runs), (name, runs)
        # What it installed is what the head holds: Ray and NCCL in the venv, one install record.
        versions = labkit.sh(name, "/opt/ray/venv/bin/python -c \"import importlib.metadata as m; "
                                   "print(m.version('ray'), m.version('nvidia-nccl-cu12'))\"").stdout.split()
        assert versions == ["2.60.0", nccl_wheel[0].split("-")[1]], (name, versions)
    # The head installed from its own directory, not over HTTP.
    assert lab[HEAD]["lab_fabric_ip"] not in got, sorted(got)


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
