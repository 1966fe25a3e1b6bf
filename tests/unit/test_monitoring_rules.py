"""The monitoring role's Prometheus files, rendered by Ansible and checked by promtool.

render.yml renders the role's templates for tests/unit/monitoring/inventory.yml
(three nodes, as the deploy sees them). promtool (from Debian's prometheus
package; `make deps` provides it) then checks the rules and the whole
configuration (file_sd target files included), and runs the alert tests in
raymetal-alerts.test.yml.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "unit" / "monitoring"
VENV_BIN = pathlib.Path(sys.executable).parent


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    proc = subprocess.run(["bash", str(ROOT / "lab" / "lab.sh"), "promtool-path"], capture_output=True, text=True,
                          check=False)
    path = proc.stdout.strip()
    if not path or not os.access(path, os.X_OK):
        pytest.fail("promtool not found (looked in PATH and at %r): run `make deps`" % path)
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("monitoring")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(HERE / "inventory.yml"), str(HERE / "render.yml"),
         "-e", "out=%s" % out],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def run(*args, cwd=None):
    proc = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_rules_pass_promtool_check_rules(rendered):
    rc, out = run("check", "rules", str(rendered / "raymetal-alerts.yml"))
    assert rc == 0, out
    assert "SUCCESS: 10 rules found" in out, out


def test_the_alerts_fire_as_the_rule_tests_say(rendered):
    shutil.copy(HERE / "raymetal-alerts.test.yml", rendered / "raymetal-alerts.test.yml")
    rc, out = run("test", "rules", "raymetal-alerts.test.yml", cwd=rendered)
    assert rc == 0, out
    assert "SUCCESS" in out, out


def test_the_rules_watch_the_mounts_that_hold_the_temp_dir(rendered):
    rules = yaml.safe_load((rendered / "raymetal-alerts.yml").read_text())
    expr = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}["RayTempDirFilling"]
    assert r"mountpoint=~`/|/scratch\.d`" in expr, expr


def test_the_targets_cover_every_ray_metrics_port_and_node_exporter_with_host_labels(rendered):
    jobs = json.loads((rendered / "jobs.json").read_text())
    assert sorted(jobs) == ["node", "ray_autoscaler", "ray_dashboard", "ray_node"]
    flat = {job: [(e["labels"]["host"], e["targets"]) for e in entries] for job, entries in jobs.items()}
    assert flat["ray_node"] == [("head", ["10.0.0.10:6384"]), ("worker1", ["10.0.0.11:6384"]),
                                ("worker2", ["10.0.0.12:6384"])]
    assert flat["node"] == [("head", ["10.0.0.10:9100"]), ("worker1", ["10.0.0.11:9100"]),
                            ("worker2", ["10.0.0.12:9100"])]
    # Only the head runs the autoscaler and the dashboard.
    assert flat["ray_autoscaler"] == [("head", ["10.0.0.10:44217"])]
    assert flat["ray_dashboard"] == [("head", ["10.0.0.10:44227"])]
    assert {e["labels"]["ray_role"] for e in jobs["ray_node"]} == {"head", "worker"}


def test_the_configuration_with_its_target_files_passes_promtool_check_config(rendered):
    """The rendered prometheus.yml, its rules and its file_sd files where they would be, moved under tmp."""
    base = rendered / "etc-prometheus"
    (base / "raymetal" / "rules").mkdir(parents=True)
    (base / "raymetal" / "targets").mkdir(parents=True)
    shutil.copy(rendered / "raymetal-alerts.yml", base / "raymetal" / "rules" / "raymetal-alerts.yml")
    for job, entries in json.loads((rendered / "jobs.json").read_text()).items():
        (base / "raymetal" / "targets" / ("%s.yml" % job)).write_text(yaml.safe_dump(entries))
    config = (rendered / "prometheus.yml").read_text().replace("/etc/prometheus/raymetal", str(base / "raymetal"))
    (base / "prometheus.yml").write_text(config)
    rc, out = run("check", "config", str(base / "prometheus.yml"))
    assert rc == 0, out
    assert "SUCCESS" in out and "1 rule files found" in out, out
    jobs = [c["job_name"] for c in yaml.safe_load(config)["scrape_configs"]]
    assert jobs == ["node", "ray_autoscaler", "ray_dashboard", "ray_node"]


def test_both_daemons_listen_on_the_fabric_address_only(rendered):
    assert '--web.listen-address=10.0.0.10:9090 ' in (rendered / "prometheus.default").read_text()
    node = (rendered / "prometheus-node-exporter.default").read_text()
    assert "--web.listen-address=10.0.0.10:9100 " in node
    assert "--collector.systemd.unit-include=ray-(head|worker)[.]service" in node
