"""Bad inventories fail in validation with one clear message and change nothing.

Each fixture in tests/fixtures/inventories/ is a broken inventory over the lab's
hosts. site.yml runs against it; the test checks the message, that it is
raised once, and that no file under the paths raymetal manages changed on any
lab node.
"""

from __future__ import annotations

import re
import subprocess
import shutil

import pytest
import yaml

from tests.lab import labkit

FIXTURES = labkit.ROOT / "tests" / "fixtures" / "inventories"
WATCHED = "/etc /opt /usr /var/lib/ray /var/cache/raymetal"
# A running Ray writes its session logs here all the time; the playbook never does.
RAY_RUNTIME = "/var/lib/ray/tmp"

CASES = {
    "empty": r"has no host in group ray_head",
    "no_head": r"has no host in group ray_head",
    "two_heads": r"Exactly one head is required in group ray_head; found 2: raymetal-head, raymetal-worker1",
    "head_is_worker": r"raymetal-head are in both ray_head and ray_worker",
    "stray_host": r"raymetal-worker2 are in ray_cluster but in neither ray_head nor ray_worker",
    "unreachable": r"1 host\(s\) cannot be reached, so nothing was changed anywhere: raymetal-ghost \(ansible_host=10\.\d+\.\d+\.250",
    "non_systemd": r"controller-not-systemd: service manager is \w+, not systemd",
    "bad_budget": r"raymetal_max_unreachable='lots' is not a count or a percentage\. Fix: set raymetal_max_unreachable",
}


def make_inventory(tmp_path, case, lab):
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    shutil.copy(FIXTURES / f"{case}.yml", inv / "hosts.yml")
    lab_vars = yaml.safe_load((labkit.LAB_INVENTORY / "group_vars" / "ray_cluster.yml").read_text())
    connection = {k: v for k, v in lab_vars.items() if k.startswith("ansible_")}
    connection["ansible_ssh_private_key_file"] = str(labkit.LAB_KEY)
    connection["ansible_ssh_common_args"] += " -o ConnectTimeout=3"
    head_ip = lab["raymetal-head"]["ansible_host"]
    connection["lab_unused_address"] = head_ip.rsplit(".", 1)[0] + ".250"
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(connection))
    for name, hvars in lab.items():
        (inv / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump({"ansible_host": hvars["ansible_host"]}))
    # The controller stands for a non-systemd host: it must keep its own connection.
    (inv / "host_vars" / "controller-not-systemd.yml").write_text(
        yaml.safe_dump({"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"})
    )
    return inv


@pytest.fixture
def marked_nodes(lab):
    """Stamp every lab node so the test can list files changed afterwards."""
    for name in lab:
        labkit.sh(name, "touch /root/.raymetal-validate-marker && sleep 1")
    yield lab
    for name in lab:
        labkit.sh(name, "rm -f /root/.raymetal-validate-marker", check=False)


def changed_files(name):
    out = labkit.sh(
        name,
        f"find {WATCHED} -xdev -path {RAY_RUNTIME} -prune -o -newer /root/.raymetal-validate-marker -print 2>/dev/null"
        " | head -20",
        check=False,
    )
    return out.stdout.split()


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_inventory_fails_once_and_changes_nothing(case, tmp_path, marked_nodes):
    inv = make_inventory(tmp_path, case, marked_nodes)
    rc, out, recap = labkit.run_playbook("site.yml", inv, timeout=300)
    assert rc != 0, out
    assert re.search(CASES[case], out), f"expected /{CASES[case]}/ in:\n{out}"
    # One failure, raised once (run_once asserts), no traceback. An unreachable
    # host also prints Ansible's own "fatal: ... UNREACHABLE ... ...ignoring".
    assert out.count("fatal:") - out.count("...ignoring") == 1, out
    assert "Traceback" not in out, out
    # Nothing was reported changed, and nothing changed on disk.
    assert recap and all(c["changed"] == 0 for c in recap.values()), (recap, out)
    for name in marked_nodes:
        assert changed_files(name) == [], f"{name} was modified by a failed validation"


LIMITED = {
    # The deploy stops in its first play (the fast path's), before any probe.
    "site.yml": (),
    # Maintenance picks its hosts on localhost (left out by --limit), then stops in check.yml.
    "playbooks/maintenance.yml": ("-e", "raymetal_maintenance_hosts=raymetal-worker2",
                                  "-e", "raymetal_maintenance_confirm=yes"),
}


@pytest.mark.parametrize("playbook", sorted(LIMITED))
def test_a_run_limited_to_part_of_the_cluster_stops_before_changing_anything(playbook, marked_nodes):
    rc, out, recap = labkit.run_playbook(playbook, labkit.LAB_INVENTORY, "--limit", "raymetal-worker2",
                                         *LIMITED[playbook], timeout=300)
    assert rc != 0, out
    assert re.search(r"--limit 'raymetal-worker2' leaves out 2 of the 3 host\(s\) of ray_cluster: "
                     r"raymetal-head, raymetal-worker1\..*Nothing was changed\. Fix: run it without --limit", out, re.S), out
    assert out.count("fatal:") == 1, out
    assert "Traceback" not in out, out
    assert recap and all(c["changed"] == 0 for c in recap.values()), (recap, out)
    for name in marked_nodes:
        assert changed_files(name) == [], f"{name} was modified by a run limited to raymetal-worker2"


EXTRA_HEAD_SOURCE = """#!/usr/bin/env python3
# A dynamic inventory source: when the marker beside its directory exists, one more host in ray_head only.
import json, os
marker = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "extra-head")
if os.path.exists(marker):
    print(json.dumps({"ray_head": {"hosts": ["raymetal-extra-head"]},
                      "_meta": {"hostvars": {"raymetal-extra-head": {"ansible_host": "127.0.0.1"}}}}))
else:
    print(json.dumps({"_meta": {"hostvars": {}}}))
"""


def test_the_fast_path_sees_a_head_added_outside_ray_cluster(cluster, lab, tmp_path):
    """The fast path skips the inventory's checks, so every head and worker is an input of the deploy: also one
    outside ray_cluster that no inventory file shows (a dynamic source's output), which validation refuses."""
    data = yaml.safe_load((labkit.LAB_INVENTORY / "hosts.yml").read_text())
    heads = [name for name, hvars in lab.items() if hvars["group"] == "ray_head"]
    workers = [name for name, hvars in lab.items() if hvars["group"] == "ray_worker"]
    # The lab's hosts and variables, but ray_cluster lists its hosts itself (not ray_head and ray_worker as
    # children), so that a host can be in ray_head without being in ray_cluster.
    flat = {
        "ray_cluster": {"vars": data["ray_cluster"]["vars"], "hosts": {
            name: {k: v for k, v in hvars.items() if k != "group"} for name, hvars in lab.items()}},
        "ray_head": {"hosts": dict.fromkeys(heads)},
        "ray_worker": {"hosts": dict.fromkeys(workers)},
    }
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump(flat))
    for name in ("group_vars", "credentials"):
        (inv / name).symlink_to(labkit.LAB_INVENTORY / name)
    script = inv / "extra.py"
    script.write_text(EXTRA_HEAD_SOURCE)
    script.chmod(0o755)
    # A deploy from this inventory records it on every node (every task runs: other inventory files).
    rc, out, recap = labkit.run_playbook("site.yml", inv, timeout=900)
    assert rc == 0, out
    # The source now puts a second head in ray_head only; no inventory file changed.
    (tmp_path / "extra-head").touch()
    rc, out, recap = labkit.run_playbook("site.yml", inv, timeout=300)
    assert rc != 0, out
    assert "Only the cluster summary runs" not in out, out
    assert re.search(r"Exactly one head is required in group ray_head; found 2: [\w-]+, [\w-]+\.", out), out
    assert "raymetal-extra-head" in out, out
    assert recap and all(c["changed"] == 0 for c in recap.values()), (recap, out)


def test_good_inventory_passes_validation(lab):
    rc, out, recap = labkit.run_playbook("playbooks/validate.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out
    assert set(lab) <= set(recap)
    assert all(c["failed"] == 0 and c["changed"] == 0 for c in recap.values())


def test_generated_secrets_are_not_inventory_hosts(lab):
    """inventory/<site>/credentials/ must never be parsed as an inventory source."""
    out = subprocess.run(
        [str(labkit.VENV_BIN / "ansible"), "-i", str(labkit.LAB_INVENTORY), "all", "--list-hosts"],
        cwd=labkit.ROOT, env=labkit.ansible_env(), capture_output=True, text=True, check=True,
    ).stdout
    hosts = {line.strip() for line in out.splitlines()[1:] if line.strip()}
    assert (labkit.LAB_INVENTORY / "credentials" / "ray_auth_token").exists()
    assert hosts == set(lab), hosts - set(lab)
