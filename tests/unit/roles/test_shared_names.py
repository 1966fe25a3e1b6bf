"""Ray's shared names have one home, the ray role (issue 39): ray_venv_path, ray_auth_token_path, ray_config_dir,
ray_user (its defaults) and the unit names ray_head_unit/ray_worker_unit (its public vars).

- Every play of raymetal's playbooks that runs the nccl or acceptance role (the tasks that read Ray's venv, user,
  token or cluster settings), or gcs_redis (Redis binds to and admits Ray's addresses), hands them the ray role's
  values, resolved by Ansible itself
  (shared_names_probe.py): a site that sets ray_venv_path gets NCCL verified in, and the checks run from, that
  venv. This is the test that the deploy's acceptance gate reading /opt/ray/venv/bin/python missed.
- The applied-state watch list follows them too.
- The defaults kept for standalone use (the nccl and acceptance roles used on their own, the ray_cluster_facts
  module) equal the ray role's.
- No role or playbook spells them elsewhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
RAY_DEFAULTS = yaml.safe_load((REPO / "roles" / "ray" / "defaults" / "main.yml").read_text())
RAY_VARS = yaml.safe_load((REPO / "roles" / "ray" / "vars" / "main.yml").read_text())

SITE = {
    "ray_venv_path": "/srv/ray/venv",
    "ray_auth_token_path": "/srv/ray/secret/token",
    "ray_config_dir": "/srv/ray/etc",
    "ray_user": "rayuser",
}


def ray_default(name):
    """The ray role's default, its {{ ray_* }} references filled in."""
    value = RAY_DEFAULTS[name]
    return re.sub(r"\{\{ (\w+) \}\}", lambda m: str(ray_default(m.group(1))), value) if isinstance(value, str) else value


def probe(tmp_path, group_vars):
    site = tmp_path / "site"
    (site / "group_vars").mkdir(parents=True)
    (site / "hosts.yml").write_text(yaml.safe_dump(
        {"ray_cluster": {"children": {"ray_head": {"hosts": {"head1": None}}, "ray_worker": {"hosts": {"worker1": None}}}}}))
    # playbooks/upgrade.yml verifies NCCL in the venv that stage installs beside ray_venv_path (ray_version_venv).
    venv = group_vars.get("ray_venv_path", RAY_DEFAULTS["ray_venv_path"])
    (site / "group_vars" / "all.yml").write_text(yaml.safe_dump(dict(group_vars, ray_version_venv=venv + "-2.60.0")))
    # The head's Ray address where the site sets it (the probe's fabric facts say 10.1.1.1 for the head).
    if group_vars:
        (site / "host_vars").mkdir()
        (site / "host_vars" / "head1.yml").write_text("ray_node_ip_address: 10.0.0.5\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("shared_names_probe.py")), str(site)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), site


@pytest.mark.parametrize("group_vars", [{}, SITE], ids=["site-sets-nothing", "site-sets-ray-names"])
def test_every_play_hands_rays_names_to_the_roles_that_read_them(tmp_path, group_vars):
    rows, site = probe(tmp_path, group_vars)
    ray = {name: group_vars.get(name, ray_default(name)) for name in SITE}
    expected = {
        "nccl_venv_path": ray["ray_venv_path"],
        "acceptance_ray_python": ray["ray_venv_path"] + "/bin/python",
        "acceptance_ray_user": ray["ray_user"],
        "acceptance_ray_token_path": ray["ray_auth_token_path"],
        "acceptance_ray_config": ray["ray_config_dir"] + "/cluster.json",
        "raymetal_applied_watch.venvs": [ray["ray_venv_path"]],
        "raymetal_applied_watch.units[:2]": ["ray-head.service", "ray-worker.service"],
        "raymetal_applied_watch.paths[0]": ray["ray_config_dir"],
        "raymetal_applied_secret_files[0]": str(site / "credentials" / "ray_auth_token"),
        # Redis for the GCS listens on its host's Ray address and admits the head's (not the fabric role's
        # address when ray_node_ip_address says otherwise); the probe resolves them for the head.
        "gcs_redis_bind_address": "10.0.0.5" if group_vars else "10.1.1.1",
        "gcs_redis_clients": ["10.0.0.5" if group_vars else "10.1.1.1"],
    }
    wrong = []
    for row in rows:
        want, got = expected[row["var"]], row["value"]
        # upgrade.yml's stage verifies NCCL in the new version's venv beside Ray's.
        ok = got in (want, want + "-2.60.0") if row["var"] == "nccl_venv_path" else got == want
        if not ok:
            wrong.append("%(playbook)s, play %(play)r: %(var)s = %(value)r" % row + ", want %r" % (want,))
    assert wrong == [], "\n".join(wrong)
    # The plays this must cover (the deploy's checks and gate, the acceptance playbook, the fast path's record).
    covered = {(row["playbook"], row["var"]) for row in rows}
    for needed in [("check.yml", "nccl_venv_path"), ("apply.yml", "nccl_venv_path"), ("apply.yml", "acceptance_ray_python"),
                   ("acceptance.yml", "acceptance_ray_python"), ("acceptance.yml", "acceptance_ray_token_path"),
                   ("upgrade.yml", "nccl_venv_path"), ("fast_path.yml", "raymetal_applied_watch.venvs"),
                   ("deploy.yml", "raymetal_applied_watch.venvs"), ("check.yml", "gcs_redis_clients"),
                   ("apply.yml", "gcs_redis_bind_address")]:
        assert needed in covered, needed


def test_the_standalone_role_defaults_are_the_ray_roles():
    """The nccl, acceptance and health roles keep a default for use on their own; it must be the ray role's."""
    nccl = yaml.safe_load((REPO / "roles" / "nccl" / "defaults" / "main.yml").read_text())
    acceptance = yaml.safe_load((REPO / "roles" / "acceptance" / "defaults" / "main.yml").read_text())
    assert nccl["nccl_venv_path"] == ray_default("ray_venv_path")
    assert acceptance["acceptance_ray_python"] == ray_default("ray_venv_path") + "/bin/python"
    assert acceptance["acceptance_ray_user"] == ray_default("ray_user")
    assert acceptance["acceptance_ray_token_path"] == ray_default("ray_auth_token_path")
    assert acceptance["acceptance_ray_config"] == ray_default("ray_config_dir") + "/cluster.json"
    # The health loop's default unit is a worker's (the deploy hands it ray_node_unit).
    health = yaml.safe_load((REPO / "roles" / "health" / "defaults" / "main.yml").read_text())
    ray_vars = yaml.safe_load((REPO / "roles" / "ray" / "vars" / "main.yml").read_text())
    assert health["health_ray_unit"] == ray_vars["ray_worker_unit"]


def test_the_ray_cluster_facts_module_defaults_are_the_ray_roles():
    """The module runs on its own too (its defaults), but reads the ray role's cluster.json when there."""
    from ansible_collections.raymetal.cluster.plugins.modules import ray_cluster_facts as rcf

    assert rcf.DEFAULT_TOKEN_PATH == ray_default("ray_auth_token_path")
    assert rcf.DEFAULT_HEAD_UNIT == RAY_VARS["ray_head_unit"] + ".service"
    assert rcf.DEFAULT_WORKER_UNIT == RAY_VARS["ray_worker_unit"] + ".service"
    options = yaml.safe_load(rcf.DOCUMENTATION)["options"]
    assert options["config_path"]["default"] == ray_default("ray_config_dir") + "/cluster.json"
    assert "C(%s)" % ray_default("ray_auth_token_path") in " ".join(options["token_path"]["description"])
    # What the ray role writes there: the same unit names, from its public vars.
    template = (REPO / "roles" / "ray" / "templates" / "cluster.json.j2").read_text()
    assert "'head_unit': ray_head_unit ~ '.service'" in template
    assert "'worker_unit': ray_worker_unit ~ '.service'" in template


# Where the literal names may still stand: the owner, and the defaults kept for standalone use (compared above).
ALLOWED = {
    "/opt/ray/venv": {"roles/ray/defaults/main.yml", "roles/ray/meta/argument_specs.yml",
                      "roles/nccl/defaults/main.yml", "roles/nccl/meta/argument_specs.yml",
                      "roles/acceptance/defaults/main.yml", "roles/acceptance/meta/argument_specs.yml"},
    "/etc/ray/auth_token": {"roles/acceptance/defaults/main.yml", "roles/acceptance/meta/argument_specs.yml"},
    "ray-head": {"roles/ray/vars/main.yml", "roles/ray/meta/argument_specs.yml",
                 # Prose in a Prometheus alert (the monitoring host runs no ray role).
                 "roles/monitoring/templates/raymetal-alerts.yml.j2"},
    "ray-worker": {"roles/ray/vars/main.yml", "roles/ray/meta/argument_specs.yml", "roles/monitoring/templates/raymetal-alerts.yml.j2",
                   # The health role's default for use on its own (a worker's unit; checked equal above).
                   "roles/health/defaults/main.yml", "roles/health/meta/argument_specs.yml"},
}


@pytest.mark.parametrize("literal", sorted(ALLOWED))
def test_no_role_or_playbook_spells_rays_names(literal):
    found = set()
    for top in ("roles", "playbooks"):
        for path in (REPO / top).rglob("*"):
            if path.is_file() and path.suffix in (".yml", ".yaml", ".j2", ".py", ".sh") and literal in path.read_text():
                found.add(str(path.relative_to(REPO)))
    assert found - ALLOWED[literal] == set(), sorted(found - ALLOWED[literal])
