"""raymetal as a collection: build it, install it into an empty project, use it by FQCN on the lab.

The empty project has only an ansible.cfg (collections_path, SSH settings and
the inventory ignore pattern docs/collection.md gives collection users) and a playbook; the roles, modules,
filters, plugin_utils and playbooks come from the installed collection alone. The role's own tasks call
fabric_facts by its short name: that it resolves (and imports its module_utils through
ansible_collections.raymetal.cluster) is part of what is tested. Then the real deploy,
`ansible-playbook raymetal.cluster.site`, runs from that project on the already-deployed lab: every
filter the roles call (by FQCN) must resolve in the installed collection, and the rerun must change
nothing and restart no Ray unit.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): it installs the built collection into an empty project and
# reruns the deploy from it. Moved from lab 1, whose tests took 48.1 minutes against lab 2's 40.9 in run34.
E2E_LAB = 2

PLAYBOOK = """\
- name: Use raymetal.cluster by FQCN from an empty project
  hosts: ray_cluster
  gather_facts: false
  become: true
  tasks:
    - name: Detect the fabric with the collection's module
      raymetal.cluster.fabric_facts:
        interface: "{{ fabric_interface }}"
        require_rdma: false
      register: detected

    - name: Report what the module found
      ansible.builtin.debug:
        msg: "FABRIC {{ inventory_hostname }} {{ detected.ansible_facts.fabric.interface }} {{ detected.ansible_facts.fabric.address }}"

    - name: Run the collection's fabric role (its read-only preflight entry point)
      ansible.builtin.include_role:
        name: raymetal.cluster.fabric
        tasks_from: preflight.yml
"""


def _run(cmd, cwd, env=None, timeout=600, split=False):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, "%s exited %d:\n%s" % (" ".join(map(str, cmd)), proc.returncode, out[-4000:])
    return (proc.stdout, proc.stderr) if split else out


def readme_inventory_section():
    """The [inventory] lines docs/collection.md tells collection users to put in their ansible.cfg."""
    text = (labkit.ROOT / "docs" / "collection.md").read_text()
    start = text.index("    [inventory]\n")
    return textwrap.dedent(text[start:text.index("\n\n", start)]) + "\n"


def ray_main_pids(lab):
    """{host: MainPID of its ray-head or ray-worker unit}, read with docker exec (containers are named as hosts)."""
    pids = {}
    for host, hvars in lab.items():
        unit = "ray-head" if hvars["group"] == "ray_head" else "ray-worker"
        pid = labkit.sh(host, "systemctl show -p MainPID --value %s" % unit).stdout.strip()
        assert pid.isdigit() and pid != "0", (host, unit, pid)
        pids[host] = pid
    return pids


def test_collection_builds_installs_and_runs_by_fqcn(lab, cluster, tmp_path):
    bin_dir = labkit.VENV_BIN
    dist = tmp_path / "dist"
    _run([bin_dir / "ansible-galaxy", "collection", "build", "--output-path", dist, labkit.ROOT], cwd=tmp_path)
    (tarball,) = dist.glob("raymetal-cluster-*.tar.gz")

    project = tmp_path / "project"
    project.mkdir()
    # Only the project's own collections path counts: molecule and ansible-lint put a copy of this
    # collection under ~/.ansible/collections, which would make the install a no-op.
    install_env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(project / "collections"))
    _run([bin_dir / "ansible-galaxy", "collection", "install", "--no-deps", "-p", project / "collections",
          tarball], cwd=project, env=install_env)
    installed = project / "collections" / "ansible_collections" / "raymetal" / "cluster"
    assert (installed / "plugins" / "module_utils" / "raymetal_sysfs.py").is_file()
    # The collection ships ansible-test's sanity ignore file and config (tests/sanity, tests/config.yml), as
    # Galaxy expects, and none of the test suite: no unit or lab tests, no fixtures, no venv.
    shipped_tests = sorted(p.relative_to(installed).as_posix() for p in (installed / "tests").rglob("*") if p.is_file())
    assert shipped_tests and all(p == "tests/config.yml" or p.startswith("tests/sanity/") for p in shipped_tests), \
        shipped_tests
    assert not (installed / ".venv").exists()

    (project / "ansible.cfg").write_text(textwrap.dedent("""\
        [defaults]
        collections_path = collections
        host_key_checking = False
        interpreter_python = auto_silent
        timeout = 30
        """) + readme_inventory_section())
    (project / "use.yml").write_text(PLAYBOOK)
    env = labkit.ansible_env()
    env["ANSIBLE_CONFIG"] = str(project / "ansible.cfg")
    env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.builtin.json"
    env.pop("ANSIBLE_LIBRARY", None)
    env.pop("ANSIBLE_ROLES_PATH", None)
    out, err = _run([bin_dir / "ansible-playbook", "-i", labkit.LAB_INVENTORY, "use.yml", "--check"],
                    cwd=project, env=env, split=True)
    result = json.loads(out)
    # The site's generated secrets and acceptance reports are not read as inventory.
    assert "WARNING" not in err, err

    stats = result["stats"]
    assert set(stats) == set(lab), stats
    for host, counts in stats.items():
        assert counts["failures"] == 0 and counts["unreachable"] == 0, (host, counts)
        assert counts["changed"] == 0, (host, counts)

    tasks = {t["task"]["name"]: t["hosts"] for play in result["plays"] for t in play["tasks"]}
    detected = tasks["Detect the fabric with the collection's module"]
    for host, hvars in lab.items():
        fabric = detected[host]["ansible_facts"]["fabric"]
        assert fabric["interface"] == "ib0", (host, fabric)
        assert fabric["address"] == hvars["lab_fabric_ip"], (host, fabric)
    # The role ran from the collection, and its short-name module call resolved there.
    role_tasks = [name for name in tasks if name.endswith("Detect the fabric interface")]
    assert role_tasks, sorted(tasks)
    for host in lab:
        assert tasks[role_tasks[0]][host].get("failed") is not True

    # The real deploy by FQCN, from the empty project, on the lab the `cluster` fixture deployed:
    # a no-op rerun that needs every role's filters (raymetal.cluster.*) from the installed collection.
    before = ray_main_pids(lab)
    out, err = _run([bin_dir / "ansible-playbook", "raymetal.cluster.site", "-i", labkit.LAB_INVENTORY],
                    cwd=project, env=env, timeout=900, split=True)
    stats = json.loads(out)["stats"]
    # Every lab node, and localhost (the play that keeps the token on the controller).
    assert set(lab) <= set(stats), (stats, err[-4000:])
    for host, counts in stats.items():
        assert counts["failures"] == 0 and counts["unreachable"] == 0, (host, counts)
        assert counts["changed"] == 0, (host, counts)
    assert ray_main_pids(lab) == before, "a Ray unit restarted"

    # The wheelhouse builder ships with the collection (it ran as `python -m raymetal.wheelhouse` from
    # the repository's root, which the collection leaves out): playbooks/wheelhouse.yml from the empty
    # project on the lab's wheelhouse, which already holds every wheel. The index is a closed port on
    # loopback, so a wheel that is missing fails the run instead of reaching the internet.
    out, err = _run([bin_dir / "ansible-playbook", "raymetal.cluster.wheelhouse", "-i", labkit.LAB_INVENTORY,
                     "-e", "ray_pip_index_url=http://127.0.0.1:9/simple"], cwd=project, env=env, timeout=600, split=True)
    result = json.loads(out)
    for host, counts in result["stats"].items():
        assert counts["failures"] == 0 and counts["changed"] == 0, (host, counts, err[-4000:])
    tasks = {t["task"]["name"]: t["hosts"] for play in result["plays"] for t in play["tasks"]}
    (download,) = [name for name in tasks if "Download Ray, ray_pip_packages" in name]
    # run_once on the controller: one host carries the loop's results (each the builder's JSON report).
    host_result = next(r for r in tasks[download].values() if "results" in r)
    reports = [json.loads(item["stdout"]) for item in host_result["results"]]
    assert reports and all(r["added"] == [] and r["changed"] is False for r in reports), reports
