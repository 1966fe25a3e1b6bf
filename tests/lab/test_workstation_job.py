"""Submitting a job from a workstation exactly as docs/jobs.md says, and extra packages on offline nodes.

The workstation is the controller. docs/jobs.md's two shell blocks (marked
"tested as written") are run as they stand, with only the lab's addresses
moved to this lab's subnets: the tunnel in the background (ended by its
process id), then the Ray CLI install, the token and `ray job submit` of
docs/jobs/every_node.py, which must run a task on every node.

Then numpy: playbooks/wheelhouse.yml downloads it into a wheelhouse of its
own (seeded with hard links to the lab's, so only numpy is fetched) and a
rerun changes nothing; preflight names numpy while the wheelhouse lacks it;
the deploy installs it from the wheelhouse and the same job uses it on every
node. The lab is left with numpy in its venvs; the `cluster` fixture of the
next session puts the default back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.lab import labkit

JOBS_DOC = (labkit.ROOT / "docs" / "jobs.md").read_text()
NUMPY = "numpy==2.4.6"
LAB_DEFAULT_MGMT, LAB_DEFAULT_FABRIC = "10.231.10.", "10.231.20."
CACHE = Path(os.environ.get("RAYMETAL_CACHE") or Path.home() / ".cache" / "raymetal")


def readme_block(tag: str) -> str:
    match = re.search(r"<!-- tested as written: tests/lab/test_workstation_job.py \(%s\) -->\n```sh\n(.*?)```" % tag,
                      JOBS_DOC, re.S)
    assert match, f"docs/jobs.md has no '{tag}' block"
    return match.group(1)


def for_this_lab(text: str) -> str:
    """docs/jobs.md is written for the default lab; move it to this lab's subnets and prefix."""
    mgmt = os.environ.get("LAB_MGMT_SUBNET", "10.231.10.0/24").rsplit(".", 1)[0] + "."
    fabric = os.environ.get("LAB_FABRIC_SUBNET", "10.231.20.0/24").rsplit(".", 1)[0] + "."
    return text.replace(LAB_DEFAULT_MGMT, mgmt).replace(LAB_DEFAULT_FABRIC, fabric).replace(
        "raymetal-", labkit.LAB_PREFIX + "-")


def tunnel_up(port=8265, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.5)
    return False


def submit_from_workstation() -> str:
    """Run docs/jobs.md's tunnel and submit blocks; return the submit block's output."""
    tunnel = subprocess.Popen(["bash", "-c", for_this_lab(readme_block("tunnel"))], cwd=labkit.ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        if not tunnel_up():
            tunnel.kill()
            pytest.fail("docs/jobs.md's tunnel did not open 127.0.0.1:8265: %s" % tunnel.communicate()[0])
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        proc = subprocess.run(["bash", "-e", "-c", for_this_lab(readme_block("submit"))], cwd=labkit.ROOT, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr
    finally:
        # Our own tunnel only: its process group, by the id Popen gave us.
        os.killpg(tunnel.pid, signal.SIGTERM)
        tunnel.wait(timeout=30)


def flat(output: str) -> str:
    """Ansible's YAML callback wraps long messages: compare with whitespace runs as one space."""
    return " ".join(output.split())


def ran_on(output: str) -> dict[str, str]:
    return dict(re.findall(r"^ran on (\S+) \([0-9.]+\): (.*)$", output, re.M))


def test_status_prints_the_readme_tunnel(cluster):
    rc, out, _ = labkit.run_playbook("playbooks/status.yml", labkit.LAB_INVENTORY, timeout=600)
    assert rc == 0, out
    assert "from a workstation: " + for_this_lab(readme_block("tunnel")).strip() in out


def test_job_from_a_workstation_runs_on_every_node_as_the_readme_says(cluster, lab):
    output = submit_from_workstation()
    assert set(ran_on(output)) == set(lab), output[-3000:]
    assert f"{len(lab)} alive nodes, {len(lab)} tasks ran" in output
    assert re.search(r"Job 'raysubmit_\w+' succeeded", output), output[-2000:]


@pytest.fixture()
def numpy_wheelhouse():
    """A wheelhouse of this lab's own, holding the lab's wheels (hard links) but not numpy yet (the lab's holds it:
    ray[train] needs it; the copy's links to it are removed, the lab's files stay)."""
    path = CACHE / f"test-wheelhouse-numpy-{labkit.LAB_PREFIX}"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(CACHE / "wheelhouse", path, copy_function=os.link)
    for wheel in path.glob("numpy-*"):
        wheel.unlink()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_numpy_is_downloaded_checked_installed_and_used_by_a_job(cluster, lab, numpy_wheelhouse, tmp_path):
    assert not list(numpy_wheelhouse.glob("numpy-*"))
    extra = tmp_path / "numpy.json"
    extra.write_text(json.dumps({"ray_wheelhouse_src": str(numpy_wheelhouse), "ray_pip_packages": [NUMPY]}))
    head = next(h for h, v in lab.items() if v["group"] == "ray_head")

    # Preflight, with the packages set and the wheelhouse without numpy: stops, naming it (and Ray's extras, which
    # need it too).
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "--check", "-e", f"@{extra}")
    assert rc != 0
    named = flat(out).split("can install for", 1)[-1][:400]
    assert NUMPY in named and "playbooks/wheelhouse.yml" in flat(out), out[-3000:]
    assert "Traceback" not in out

    # The builder fetches numpy (and only what is new), then a rerun changes nothing.
    rc, out, recap = labkit.run_playbook("playbooks/wheelhouse.yml", labkit.LAB_INVENTORY, "-e", f"@{extra}")
    assert rc == 0, out
    assert recap[head]["changed"] == 1, out
    assert [p.name.split("-")[1] for p in numpy_wheelhouse.glob("numpy-*.whl")] == ["2.4.6"]
    # For the nodes' Python (cp311 on Debian 12, cp313 on Debian 13).
    abi = labkit.sh(head, "python3 -c 'import sys; print(\"cp%d%d\" % sys.version_info[:2])'").stdout.strip()
    assert re.search(rf"added: numpy-2\.4\.6-{abi}-", flat(out)), out
    rc, out, recap = labkit.run_playbook("playbooks/wheelhouse.yml", labkit.LAB_INVENTORY, "-e", f"@{extra}")
    assert rc == 0 and recap[head]["changed"] == 0, out
    assert "added: nothing" in flat(out)

    # Deploy from it: numpy lands in every venv, and a job uses it on every node.
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", f"@{extra}")
    assert rc == 0, out[-5000:]
    output = submit_from_workstation()
    assert ran_on(output) == {h: "numpy 2.4.6 (check 6)" for h in lab}, output[-3000:]
