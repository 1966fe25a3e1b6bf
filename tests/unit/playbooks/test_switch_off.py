"""A service switched off stops, and its files go, before the firewall forgets its port (issue 35).

The monitoring role's tasks/switch_off.yml and the ray role's tasks/mirror-off.yml run for real on this machine
(tests/unit/playbooks/switch_off/play.yml, connection local) against a scratch tree that stands for a node's / (the roles'
test-only __*_switch_off_root) and a stand-in systemctl on PATH that keeps unit states in files and records every
call. What this cannot show: a real systemd stopping real services (the molecule monitoring scenario's side effect
and tests/lab/test_monitoring.py do).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent / "switch_off"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

NODE_EXPORTER_ARGS = "# Arguments of prometheus-node-exporter.service (Debian's unit reads ARGS from this file).\nARGS=\"\"\n"
PROMETHEUS_ARGS = "# Arguments of prometheus.service (Debian's unit reads ARGS from this file).\nARGS=\"\"\n"
PROMETHEUS_YML = "# Ansible managed\n# Prometheus on head: every Ray metrics port and node_exporter\n"


def node(tmp_path, files=(), units=None):
    """A scratch / with the given files ({path: text}; text None: a directory) and unit states ({unit: 'en act'})."""
    root = tmp_path / "node"
    state = tmp_path / "systemd"
    root.mkdir()
    state.mkdir()
    for path, text in dict(files).items():
        where = root / path.lstrip("/")
        if text is None:
            where.mkdir(parents=True, exist_ok=True)
        else:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(text)
    for unit, value in (units or {}).items():
        (state / unit).write_text(value + "\n")
    return root, state


def run(root, state, *extra, check=False):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               PATH="%s:%s" % (HERE, os.environ.get("PATH", "")), FAKE_SYSTEMCTL_DIR=str(state))
    argv = [str(ANSIBLE_PLAYBOOK), "-i", str(HERE / "inventory.yml"), str(HERE / "play.yml"),
            "-e", "__monitoring_switch_off_root=%s" % root, "-e", "__ray_switch_off_root=%s" % root]
    for item in extra:
        argv += ["-e", item]
    if check:
        argv.append("--check")
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def changed(out):
    return int(re.search(r"localhost\s+:\s+ok=\d+\s+changed=(\d+)", out).group(1))


def calls(state):
    path = state / "calls"
    return [line for line in path.read_text().splitlines() if line.split()[0] in ("stop", "disable")] if path.exists() else []


# A head that ran everything raymetal's monitoring sets up, and the wheelhouse mirror.
EVERYTHING = {
    "/etc/default/prometheus-node-exporter": NODE_EXPORTER_ARGS,
    "/etc/default/prometheus": PROMETHEUS_ARGS,
    "/etc/prometheus/prometheus.yml": PROMETHEUS_YML,
    "/etc/prometheus/raymetal/targets/node.yml": "[]\n",
    "/etc/grafana/provisioning/datasources/raymetal.yaml": "x\n",
    "/etc/grafana/provisioning/dashboards/raymetal.yaml": "x\n",
    "/etc/grafana/raymetal-admin-password": "secret",
    "/var/lib/grafana/dashboards/raymetal/raymetal-gpu-fabric.json": "{}\n",
    "/etc/systemd/system/grafana-server.service.d/raymetal.conf": "[Service]\n",
    "/etc/dcgm-exporter/raymetal-counters.csv": "x\n",
    "/etc/systemd/system/nvidia-dcgm-exporter.service.d/raymetal.conf": "[Service]\n",
    "/etc/nginx/raymetal-wheelhouse.conf": "x\n",
    "/etc/systemd/system/raymetal-wheelhouse.service": "[Unit]\n",
    # The site's own, beside raymetal's: never touched.
    "/etc/grafana/grafana.ini": "site\n",
    "/etc/nginx/nginx.conf": "site\n",
}
RUNNING = {u: "enabled active" for u in (
    "prometheus-node-exporter.service", "prometheus.service", "grafana-server.service",
    "nvidia-dcgm-exporter.service", "nvidia-dcgm.service", "raymetal-wheelhouse.service")}
ALL_OFF = ("monitoring_enabled=false",)


def test_check_mode_only_reports(tmp_path):
    root, state = node(tmp_path, EVERYTHING, RUNNING)
    out = run(root, state, *ALL_OFF, check=True)
    assert "switched off: node_exporter,prometheus,grafana,dcgm,wheelhouse_mirror" in out
    assert changed(out) > 0
    for unit in RUNNING:
        assert "(item=%s)" % unit in out, unit
    assert calls(state) == []
    for path in EVERYTHING:
        assert (root / path.lstrip("/")).exists(), path


def test_switch_off_stops_disables_removes_and_a_rerun_changes_nothing(tmp_path):
    root, state = node(tmp_path, EVERYTHING, RUNNING)
    out = run(root, state, *ALL_OFF)
    assert changed(out) > 0
    for unit in RUNNING:
        assert (state / unit).read_text().split() == ["disabled", "inactive"], unit
    assert sorted(c.split()[0] for c in calls(state)) == ["disable"] * 6 + ["stop"] * 6
    gone = [p for p in EVERYTHING if not (root / p.lstrip("/")).exists()]
    assert sorted(gone) == sorted(p for p in EVERYTHING if p not in (
        "/etc/grafana/grafana.ini", "/etc/nginx/nginx.conf"))
    # raymetal's drop-in directories went with their only file; its Prometheus directory whole.
    assert not (root / "etc/systemd/system/grafana-server.service.d").exists()
    assert not (root / "etc/prometheus/raymetal").exists()
    # The wheelhouse directory is not among what goes.
    again = run(root, state, *ALL_OFF)
    assert changed(again) == 0, again
    assert "msg: 'switched off: '" in again


def test_services_raymetal_did_not_set_up_are_left_alone(tmp_path):
    # The packages' own files, running units, a site drop-in: no raymetal marker anywhere.
    site = {
        "/etc/default/prometheus-node-exporter": 'ARGS=""\n',
        "/etc/default/prometheus": 'ARGS=""\n',
        "/etc/prometheus/prometheus.yml": "global: {}\n",
        "/etc/systemd/system/grafana-server.service.d/site.conf": "[Service]\n",
        "/etc/nginx/nginx.conf": "site\n",
    }
    root, state = node(tmp_path, site, RUNNING)
    out = run(root, state, *ALL_OFF)
    assert changed(out) == 0, out
    assert calls(state) == []
    for path in site:
        assert (root / path.lstrip("/")).exists(), path


def test_a_site_drop_in_beside_raymetal_s_stays(tmp_path):
    files = {"/etc/systemd/system/grafana-server.service.d/raymetal.conf": "[Service]\n",
             "/etc/systemd/system/grafana-server.service.d/site.conf": "[Service]\n"}
    root, state = node(tmp_path, files, {"grafana-server.service": "enabled active"})
    run(root, state, *ALL_OFF)
    assert not (root / "etc/systemd/system/grafana-server.service.d/raymetal.conf").exists()
    assert (root / "etc/systemd/system/grafana-server.service.d/site.conf").exists()
    assert (state / "grafana-server.service").read_text().split() == ["disabled", "inactive"]


def test_what_is_still_wanted_keeps_running(tmp_path):
    # Monitoring on, this host the monitoring host, Grafana off, no GPU: only Grafana and DCGM go; the mirror
    # stays on the mirror host (the head) while it installs from a wheelhouse through it.
    root, state = node(tmp_path, EVERYTHING, RUNNING)
    out = run(root, state, "monitoring_enabled=true", "ray_install_source=wheelhouse")
    assert "switched off: grafana,dcgm" in out
    for unit in ("prometheus-node-exporter.service", "prometheus.service", "raymetal-wheelhouse.service"):
        assert (state / unit).read_text().split() == ["enabled", "active"], unit
    for unit in ("grafana-server.service", "nvidia-dcgm-exporter.service", "nvidia-dcgm.service"):
        assert (state / unit).read_text().split() == ["disabled", "inactive"], unit
    assert (root / "etc/prometheus/raymetal").exists()
    assert (root / "etc/nginx/raymetal-wheelhouse.conf").exists()
    assert not (root / "etc/grafana/raymetal-admin-password").exists()


@pytest.mark.parametrize("switch", [
    ("ray_install_source=wheelhouse", "ray_wheelhouse_fanout=copy"),
    ("ray_install_source=index",),
    # Another host is the mirror host now.
    ("ray_install_source=wheelhouse", "ray_wheelhouse_mirror_host=worker9"),
])
def test_the_old_mirror_host_stops_serving(tmp_path, switch):
    files = {"/etc/nginx/raymetal-wheelhouse.conf": "x\n", "/etc/systemd/system/raymetal-wheelhouse.service": "[Unit]\n",
             "/var/cache/raymetal/wheelhouse/ray-2.60.0-cp311-none-any.whl": "wheel"}
    root, state = node(tmp_path, files, {"raymetal-wheelhouse.service": "enabled active"})
    out = run(root, state, "monitoring_enabled=true", "monitoring_grafana_enabled=true", *switch)
    assert "switched off: wheelhouse_mirror" in out
    assert (state / "raymetal-wheelhouse.service").read_text().split() == ["disabled", "inactive"]
    assert not (root / "etc/nginx/raymetal-wheelhouse.conf").exists()
    assert not (root / "etc/systemd/system/raymetal-wheelhouse.service").exists()
    # The shipped wheelhouse stays (a copy fan-out uses the same directory; teardown removes it).
    assert (root / "var/cache/raymetal/wheelhouse/ray-2.60.0-cp311-none-any.whl").exists()


def test_the_markers_are_lines_of_the_roles_templates():
    # A template edit that dropped a marker line would make switch_off.yml blind to raymetal's own files.
    comps = yaml.safe_load((ROOT / "roles/monitoring/vars/main.yml").read_text())["__monitoring_components"]
    templates = {"/etc/default/prometheus-node-exporter": "prometheus-node-exporter.default.j2",
                 "/etc/default/prometheus": "prometheus.default.j2",
                 "/etc/prometheus/prometheus.yml": "prometheus.yml.j2",
                 "/etc/default/prometheus-alertmanager": "prometheus-alertmanager.default.j2",
                 "/etc/prometheus/alertmanager.yml": "alertmanager.yml.j2"}
    written = {path: text for comp in comps for path, text in (comp.get("written") or {}).items()}
    assert sorted(written) == sorted(templates)
    for path, text in written.items():
        assert text in (ROOT / "roles/monitoring/templates" / templates[path]).read_text(), path


def test_the_plan_stops_only_what_runs_or_starts_at_boot():
    from ansible_collections.raymetal.cluster.plugins.filter.switch_off import switch_off_plan

    comps = [{"name": "a", "wanted": False, "units": ["a.service", "b.service", "c.service"],
              "owned": ["/etc/a"], "dropins": ["/etc/systemd/system/a.service.d/raymetal.conf"]}]
    lines = ["unit a.service enabled inactive", "unit b.service disabled active", "unit c.service static inactive",
             "exists /etc/a"]
    plan = switch_off_plan(lines, comps)
    assert plan["units"] == [{"unit": "a.service", "stop": False, "disable": True},
                             {"unit": "b.service", "stop": True, "disable": False}]
    assert plan["paths"] == ["/etc/a"] and not plan["daemon_reload"]
    assert switch_off_plan(lines, [dict(comps[0], wanted=True)])["components"] == []
    assert switch_off_plan(lines[:3], comps)["units"] == []


@pytest.mark.parametrize("playbook", ["apply.yml", "upgrade.yml"])
def test_services_stop_before_the_firewall_drops_their_ports(playbook):
    """switch_off.yml runs before the firewall's rules are applied: in the play that applies them (upgrade.yml) or
    in the play before it (apply.yml, where the firewall has a play of its own, the full path per role). Only an
    import of the firewall's rules counts (its main entry point), not one that reads its defaults or checks."""
    plays = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
    steps = []
    for index, play in enumerate(plays):
        for task in play.get("tasks") or []:
            role = task.get("ansible.builtin.import_role") or {}
            if task.get("ansible.builtin.import_tasks") == "tasks/switch_off.yml":
                steps.append((index, "switch_off"))
            elif role.get("name") == "firewall" and role.get("tasks_from", "main.yml") in ("main", "main.yml"):
                steps.append((index, "firewall"))
    names = [name for _, name in steps]
    assert names.count("switch_off") == 1 and names.count("firewall") == 1, steps
    assert names.index("switch_off") < names.index("firewall"), steps
    switch_play = next(i for i, n in steps if n == "switch_off")
    firewall_play = next(i for i, n in steps if n == "firewall")
    # The firewall's play follows at once: no other role's tasks run on the nodes in between.
    assert firewall_play - switch_play <= 1, steps
    # No earlier play of the deploy applies the firewall.
    assert "firewall" not in yaml.safe_dump(plays[:switch_play])
