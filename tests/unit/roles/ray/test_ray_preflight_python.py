"""The ray role's preflight on nodes of different Pythons (Debian 12: 3.11, Debian 13: 3.13).

Runs the role's own task files (roles/ray/tasks/preflight-python.yml and preflight-wheelhouse.yml) with
ansible-playbook on this machine (connection local), with the Python each host's probe would have found
(__ray_python_version, set by preflight.yml from ray_node_probe.py's `interpreter`) given as host
variables, and a wheelhouse of empty files named as pip downloads them. What a real mixed lab does
is in tests/lab/test_mixed_release.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[4]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

CP311 = ["ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl",
         "grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"]
CP313 = ["ray-2.60.0-cp313-cp313-manylinux2014_x86_64.whl",
         "grpcio-1.85.3-cp313-cp313-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"]
SHARED = ["nvidia_nccl_cu12-2.32.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
          "cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl"]


def run(tmp_path, tasks_from, pythons, wheels=(), **role_vars):
    """Run one of the ray role's task files on local hosts (the first is the head); (rc, output)."""
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir(exist_ok=True)
    for name in wheels:
        (wheelhouse / name).write_bytes(b"")
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "__ray_python_version": version} for name, version in pythons.items()}
    names = list(hosts)
    inventory = {"ray_cluster": {"children": {
        "ray_head": {"hosts": {names[0]: hosts[names[0]]}},
        "ray_worker": {"hosts": {name: hosts[name] for name in names[1:]}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [{"name": "Preflight", "hosts": "ray_cluster", "gather_facts": False, "tasks": [{
        "name": "Run the task file", "ansible.builtin.include_role": {"name": "ray", "tasks_from": tasks_from},
        "vars": dict({"ray_install_source": "wheelhouse", "ray_wheelhouse_src": str(wheelhouse)}, **role_vars)}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CACHE_PLUGIN="memory")
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_nodes_on_one_python_pass(tmp_path):
    rc, out = run(tmp_path, "preflight-python.yml", {"head": "3.13.5", "w1": "3.13.5", "w2": "3.13.5"})
    assert rc == 0, out


def test_a_mixed_python_cluster_is_refused_naming_each_python_and_its_hosts(tmp_path):
    rc, out = run(tmp_path, "preflight-python.yml", {"head": "3.11.2", "w1": "3.13.5", "w2": "3.13.5"})
    assert rc != 0, out
    assert ("Ray refuses to put nodes with different Pythons in one cluster (Ray 2.60.0 compares X.Y.Z), and these "
            "hosts differ: Python 3.11.2 on head; Python 3.13.5 on w1, w2. Nothing was changed on any node.") in out
    assert "set ray_python on the odd hosts to an interpreter of the same version as the head's (3.11.2)" in out
    # Ray compares the patch level too: 3.11.2 and 3.11.4 do not form a cluster either.
    rc, out = run(tmp_path, "preflight-python.yml", {"head": "3.11.2", "w1": "3.11.4"})
    assert rc != 0 and "Python 3.11.2 on head; Python 3.11.4 on w1." in out, out


def test_each_node_finds_the_wheels_for_its_own_python(tmp_path):
    rc, out = run(tmp_path, "preflight-wheelhouse.yml", {"head": "3.11.2", "w1": "3.13.5"},
                  wheels=CP311 + CP313 + SHARED, ray_pip_role_packages=["nvidia-nccl-cu12==2.32.3"])
    assert rc == 0, out


def test_a_node_whose_python_has_no_wheels_is_named_with_its_python_the_variable_and_the_fix(tmp_path):
    rc, out = run(tmp_path, "preflight-wheelhouse.yml", {"head": "3.13.5", "w1": "3.13.5"},
                  wheels=CP311 + SHARED, ray_pip_role_packages=["nvidia-nccl-cu12==2.32.3"])
    assert rc != 0, out
    wheelhouse = tmp_path / "wheelhouse"
    for host in ("head", "w1"):
        assert (f"{host}: the wheelhouse {wheelhouse} (ray_wheelhouse_src, on the controller) has no wheel that this "
                f"node's Python 3.13.5 (ray_python=python3) can install for ray[default]==2.60.0 (it holds ray none; "
                f"ray 2.60.0 only for Python 3.11). Nothing was changed on any node.") in out
    assert "run `ansible-playbook playbooks/wheelhouse.yml -i <this inventory>`" in out
    assert "ray_wheelhouse_python_version, when set, must be 3.13 for this node" in out
    # The NCCL wheel (py3-none) fits every Python: it is not named.
    assert "nvidia-nccl-cu12" not in out.split("can install for")[1].split(".")[0]
