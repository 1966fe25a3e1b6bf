"""A mixed-release lab: a worker on the other Debian release joins the deployed lab's inventory.

Debian 12 runs Python 3.11 and Debian 13 Python 3.13, and Ray 2.60 refuses a node whose Python
differs from the cluster's (`ray start` on the worker: "Version mismatch", compared to X.Y.Z; seen
in the lab, see docs/operating-systems.md). So raymetal refuses such an inventory in preflight,
before any node changes. The test adds a third worker of the other release to the session's
deployed lab (lab/lab.sh up with LAB_WORKERS=3 and LAB_WORKER_RELEASE naming it), runs site.yml,
and checks what users are promised: the run stops with one message naming each Python and its
hosts, nothing changed on any node (no Ray unit restarted, nothing installed on the new worker).
The lab is then put back (two workers). It prefers lab 2, the Debian 13 lab of `make e2e`; on a
Debian 12 lab the odd worker runs Debian 13.
"""

from __future__ import annotations

import os
import subprocess

from tests.lab import labkit

E2E_LAB = 2

HEAD = labkit.HEAD
ODD = f"{labkit.LAB_PREFIX}-worker3"
OTHER = {"bookworm": "trixie", "trixie": "bookworm"}


def lab_up(workers: int, worker_release: str | None = None) -> dict[str, dict]:
    env = dict(os.environ, LAB_WORKERS=str(workers))
    env.pop("LAB_WORKER_RELEASE", None)
    if worker_release:
        env["LAB_WORKER_RELEASE"] = worker_release
    proc = subprocess.run(["bash", str(labkit.ROOT / "lab" / "lab.sh"), "up"], cwd=labkit.ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return labkit.lab_hosts()


def python_of(name: str) -> str:
    return labkit.sh(name, "python3 -c 'import platform; print(platform.python_version())'").stdout.strip()


def test_a_worker_on_the_other_release_is_refused_in_preflight_and_nothing_changes(cluster, lab):
    release = lab[HEAD]["lab_release"]
    assert {hvars["lab_release"] for hvars in lab.values()} == {release}, lab
    units_before = labkit.invocation_ids(lab)
    try:
        grown = lab_up(3, f"{release} {release} {OTHER[release]}")
        assert grown[ODD]["lab_release"] == OTHER[release], grown
        ours, theirs = python_of(HEAD), python_of(ODD)
        assert ours.split(".")[:2] != theirs.split(".")[:2], (ours, theirs)

        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        text = " ".join(out.split())
        assert rc != 0, out
        members = ", ".join(sorted(lab))
        expected = sorted([(ours, f"Python {ours} on {members}"), (theirs, f"Python {theirs} on {ODD}")])
        assert ("Ray refuses to put nodes with different Pythons in one cluster (Ray 2.60.0 compares X.Y.Z), and "
                f"these hosts differ: {expected[0][1]}; {expected[1][1]}. Nothing was changed on any node.") in text, text
        assert f"an interpreter of the same version as the head's ({ours})" in text, text
        # The run stopped in the checks: no host changed, no Ray unit restarted, no Ray on the odd worker.
        changed = {host: counts["changed"] for host, counts in stats.items() if counts["changed"]}
        assert changed == {}, (changed, out)
        assert labkit.invocation_ids(lab) == units_before
        assert labkit.sh(ODD, "test -e /opt/ray || test -e /etc/ray", check=False).returncode == 1
    finally:
        back = lab_up(2)
    assert set(back) == set(lab)
    assert labkit.alive_ips(lab) == {hvars["lab_fabric_ip"] for hvars in lab.values()}
