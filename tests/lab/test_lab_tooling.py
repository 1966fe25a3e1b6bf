"""lab/lab.sh on its own, with a prefix and networks of its own.

`up` twice keeps the same containers (the nodes and the apt mirror; the second
one only checks); `down` removes every container, network, key and inventory it
made, and keeps the cached image.
"""

from __future__ import annotations

import os
import subprocess

from tests.lab import labkit

PREFIX = "rmlabtest"


def lab_sh(cmd, tmp_path):
    env = dict(
        os.environ, LAB_PREFIX=PREFIX, LAB_WORKERS="1",
        LAB_MGMT_SUBNET="10.231.200.0/24", LAB_FABRIC_SUBNET="10.231.210.0/24",
        LAB_STATE=str(tmp_path / "state"), LAB_INVENTORY=str(tmp_path / "hosts.yml"),
    )
    return subprocess.run(["bash", str(labkit.ROOT / "lab" / "lab.sh"), cmd], env=env,
                          capture_output=True, text=True, timeout=600)


def container_names():
    out = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}", "--filter", f"label=io.raymetal.lab={PREFIX}"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(out.split())


def docker_ids(kind):
    args = ["docker", kind, "ls", "-q"] if kind == "network" else ["docker", "ps", "-aq"]
    out = subprocess.run(args + ["--filter", f"label=io.raymetal.lab={PREFIX}"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(out.split())


def test_up_is_idempotent_and_down_leaves_nothing(tmp_path):
    try:
        first = lab_sh("up", tmp_path)
        assert first.returncode == 0, first.stderr
        containers, networks = docker_ids("container"), docker_ids("network")
        assert container_names() == [f"{PREFIX}-head", f"{PREFIX}-mirror", f"{PREFIX}-worker1"]
        assert len(networks) == 2
        inventory = (tmp_path / "hosts.yml").read_text()
        assert f"{PREFIX}-head" in inventory and f"{PREFIX}-worker1" in inventory
        ib0 = labkit.sh(f"{PREFIX}-worker1", "ip -4 -o addr show ib0").stdout
        assert "10.231.210.11/24" in ib0

        second = lab_sh("up", tmp_path)
        assert second.returncode == 0, second.stderr
        assert "started" not in second.stderr and "built" not in second.stderr, second.stderr
        assert docker_ids("container") == containers
    finally:
        down = lab_sh("down", tmp_path)
    assert down.returncode == 0, down.stderr
    assert docker_ids("container") == [] and docker_ids("network") == []
    assert not (tmp_path / "state").exists() and not (tmp_path / "hosts.yml").exists()
    image = lab_sh("image-name", tmp_path).stdout.strip()
    assert subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
