"""The monitoring role's Prometheus files, rendered by Ansible and checked by promtool.

render.yml runs the role's preflight and renders its templates for
tests/unit/roles/monitoring/promtool/inventory.yml (three nodes as the deploy sees them, one
with GPUs; Grafana on). promtool (from Debian's prometheus package; `make deps`
provides it) then checks the rules and the whole configuration (file_sd target
files included), and runs the alert tests in raymetal-alerts.test.yml. The
DCGM and Grafana files, which nothing here can run (no GPU, Grafana is not in
Debian), are checked for structure and for agreeing with each other.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[4]
HERE = pathlib.Path(__file__).resolve().parent / "promtool"
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
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def run(*args, cwd=None):
    proc = subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=900, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_rules_pass_promtool_check_rules(rendered):
    rc, out = run("check", "rules", str(rendered / "raymetal-alerts.yml"))
    assert rc == 0, out
    assert "SUCCESS: 19 rules found" in out, out


def test_the_alerts_fire_as_the_rule_tests_say(rendered):
    shutil.copy(HERE / "raymetal-alerts.test.yml", rendered / "raymetal-alerts.test.yml")
    rc, out = run("test", "rules", "raymetal-alerts.test.yml", cwd=rendered)
    assert rc == 0, out
    assert "SUCCESS" in out, out


def test_each_node_names_the_filesystem_of_its_temp_dir_in_a_textfile_metric_the_rule_joins_on(rendered):
    """The rule needs no other node's probe (a node the run leaves alone keeps its textfile): each node's textfile
    passes promtool's lint and names its own mount, escaped for the exposition format."""
    expected = {"head": "/", "worker1": "/", "worker2": "/scratch.d", "escaped": '/mnt/a \\"b\\"\\\\c'}
    for name, mount in expected.items():
        text = (rendered / ("raymetal_ray_temp_dir.%s.prom" % name)).read_text()
        proc = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 0, (name, text, proc.stdout + proc.stderr)
        assert text.splitlines()[-1] == 'raymetal_ray_temp_dir_mount{mountpoint="%s"} 1' % mount, (name, text)
    rules = yaml.safe_load((rendered / "raymetal-alerts.yml").read_text())
    expr = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}["RayTempDirFilling"]
    assert 'and on (instance, mountpoint) raymetal_ray_temp_dir_mount{job="node"} == 1' in expr, expr
    assert "mountpoint=~" not in expr, expr


def test_the_targets_cover_every_ray_metrics_port_and_node_exporter_with_host_labels(rendered):
    jobs = json.loads((rendered / "jobs.json").read_text())
    assert sorted(jobs) == ["gpu", "node", "ray_autoscaler", "ray_dashboard", "ray_node", "s3_store"]
    flat = {job: [(e["labels"]["host"], e["targets"]) for e in entries] for job, entries in jobs.items()}
    assert flat["ray_node"] == [("head", ["10.0.0.10:6384"]), ("worker1", ["10.0.0.11:6384"]),
                                ("worker2", ["10.0.0.12:6384"])]
    assert flat["node"] == [("head", ["10.0.0.10:9100"]), ("worker1", ["10.0.0.11:9100"]),
                            ("worker2", ["10.0.0.12:9100"])]
    # Only the head runs the autoscaler and the dashboard.
    assert flat["ray_autoscaler"] == [("head", ["10.0.0.10:44217"])]
    assert flat["ray_dashboard"] == [("head", ["10.0.0.10:44227"])]
    assert {e["labels"]["ray_role"] for e in jobs["ray_node"]} == {"head", "worker"}
    # dcgm-exporter only where the GPU detection found GPUs.
    assert flat["gpu"] == [("worker1", ["10.0.0.11:9400"])]
    # The S3 store's metrics on its host alone (its metrics port; not its S3 API or its gRPC port).
    assert flat["s3_store"] == [("worker2", ["10.0.0.12:8341"])]


def test_the_configuration_with_its_target_files_passes_promtool_check_config(rendered):
    """The rendered prometheus.yml, its rules and its file_sd files where they would be, moved under tmp."""
    base = rendered / "etc-prometheus"
    (base / "raymetal" / "rules").mkdir(parents=True)
    (base / "raymetal" / "targets").mkdir(parents=True)
    shutil.copy(rendered / "raymetal-alerts.yml", base / "raymetal" / "rules" / "raymetal-alerts.yml")
    # The files the role writes (raymetal.cluster.monitoring_target_files through Ansible), one per job.
    files = json.loads((rendered / "target_files.json").read_text())
    assert [f["path"] for f in files] == ["/etc/prometheus/raymetal/targets/%s.yml" % job
                                          for job in sorted(json.loads((rendered / "jobs.json").read_text()))]
    for entry in files:
        (base / "raymetal" / "targets" / entry["path"].rsplit("/", 1)[1]).write_text(entry["content"])
    config = (rendered / "prometheus.yml").read_text().replace("/etc/prometheus/raymetal", str(base / "raymetal"))
    (base / "prometheus.yml").write_text(config)
    rc, out = run("check", "config", str(base / "prometheus.yml"))
    assert rc == 0, out
    assert "SUCCESS" in out and "1 rule files found" in out, out
    jobs = [c["job_name"] for c in yaml.safe_load(config)["scrape_configs"]]
    assert jobs == ["gpu", "node", "ray_autoscaler", "ray_dashboard", "ray_node", "s3_store"]


def test_both_daemons_listen_on_the_fabric_address_only(rendered):
    assert '--web.listen-address=10.0.0.10:9090 ' in (rendered / "prometheus.default").read_text()
    node = (rendered / "prometheus-node-exporter.default").read_text()
    assert "--web.listen-address=10.0.0.10:9100 " in node
    assert "--collector.systemd.unit-include=ray-(head|worker)[.]service" in node
    # The health loop's *.prom files (roles/health) are read from this directory.
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in node


def test_alerts_go_from_prometheus_to_alertmanager_on_loopback_and_on_to_the_receivers(rendered):
    config = yaml.safe_load((rendered / "prometheus.yml").read_text())
    assert config["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}
    # Loopback only, and the HA cluster listener off (an empty address): nothing of it on the fabric.
    args = (rendered / "prometheus-alertmanager.default").read_text()
    assert 'ARGS="--web.listen-address=127.0.0.1:9093 --cluster.listen-address="\n' in args
    am = yaml.safe_load((rendered / "alertmanager.yml").read_text())
    assert am["route"]["receiver"] == "raymetal" and am["route"]["group_wait"] == "30s"
    (receiver,) = am["receivers"]
    assert receiver["webhook_configs"] == [{"url": "https://hooks.example.org/raymetal?token=s3cret",
                                            "send_resolved": True}]
    assert receiver["email_configs"] == [{"to": "hpc-admins@example.org", "send_resolved": True}]
    assert am["global"]["smtp_smarthost"] == "mail.example.org:25"
    # Both of its ports are in the monitoring host's firewall list, closed to all but loopback (Debian starts the
    # package on every address before its arguments are written).
    published = facts(rendered)
    ports = {h: [p for p in f["monitoring_ports"] if p["name"].startswith("alertmanager")] for h, f in published.items()}
    assert ports == {"head": [{"name": "alertmanager", "port": 9093, "proto": "tcp", "scope": "closed"},
                              {"name": "alertmanager_cluster", "port": 9094, "proto": "tcp", "scope": "closed"}],
                     "worker1": [], "worker2": []}


@pytest.mark.parametrize("extra, words", [
    ({"monitoring_alertmanager_webhooks": ["https://hooks.example.org/a", "user:pw@hooks.example.org/b"]},
     "monitoring_alertmanager_webhooks holds 1 entry(ies) that are not http:// or https:// URLs "
     "(first: user:pw@hooks.example.org/b). Fix: give each webhook as a full URL"),
    ({"monitoring_alertmanager_email_to": ["ops@example.org"], "monitoring_alertmanager_smtp_smarthost": "mail"},
     'monitoring_alertmanager_email_to is set but monitoring_alertmanager_smtp_smarthost ("mail") is not host:port.'),
])
def test_a_bad_alert_receiver_stops_the_preflight_with_the_fix(tmp_path, extra, words):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    proc = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(HERE / "inventory.yml"), str(HERE / "render.yml"),
         "-e", "out=%s" % tmp_path, "-e", json.dumps(extra)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0 and words in out, out[-3000:]
    assert "Traceback" not in out


def test_every_nodes_monitoring_ports_pass_the_firewalls_input_check_beside_rays(rendered):
    """The firewall role checks the list the deploy hands it (Ray's ports and the monitoring's): unique names,
    valid ports and scopes. Two entries of one name stopped every deploy with monitoring on."""
    from ansible_collections.raymetal.cluster.plugins.filter.firewall import firewall_invalid_ports

    inventory = yaml.safe_load((HERE / "inventory.yml").read_text())
    ray_ports = inventory["ray_cluster"]["vars"]["__ports"]
    # The S3 store's host also lists the store's ports (firewall_ports in roles/wiring: all three lists).
    storage = inventory["ray_cluster"]["children"]["ray_worker"]["hosts"]["worker2"]["shared_storage_ports"]
    for host, published in facts(rendered).items():
        extra = storage if host == "worker2" else []
        assert firewall_invalid_ports(ray_ports + published["monitoring_ports"] + extra) == [], host


def facts(rendered):
    return json.loads((rendered / "facts.json").read_text())


def test_dcgm_runs_on_the_gpu_node_only_and_its_port_is_a_metrics_port(rendered):
    published = facts(rendered)
    assert {h: f["__monitoring_dcgm_on"] for h, f in published.items()} == {
        "head": False, "worker1": True, "worker2": False}
    ports = {h: {p["name"]: p for p in f["monitoring_ports"]} for h, f in published.items()}
    assert ports["worker1"]["dcgm_exporter"] == {"name": "dcgm_exporter", "port": 9400, "proto": "tcp",
                                                 "scope": "all", "metrics": True}
    assert "dcgm_exporter" not in ports["head"] and "dcgm_exporter" not in ports["worker2"]
    # Grafana on the monitoring host only, like Prometheus: admin networks and the tunnel.
    assert ports["head"]["grafana"] == {"name": "grafana", "port": 3000, "proto": "tcp", "scope": "closed",
                                        "admin": True}
    assert "grafana" not in ports["worker1"]


def test_dcgm_exporter_listens_on_the_fabric_address_with_the_roles_counters(rendered):
    dropin = (rendered / "dcgm-exporter.dropin.conf").read_text()
    lines = [line for line in dropin.splitlines() if line.startswith("ExecStart=")]
    assert lines[0] == "ExecStart=", "the packaged ExecStart must be reset first"
    assert lines[1].split() == ["ExecStart=/usr/bin/dcgm-exporter", "--address", "10.0.0.11:9400", "--collectors",
                                "/etc/dcgm-exporter/raymetal-counters.csv", "--remote-hostengine-info",
                                "localhost:5555"]


def counters():
    text = (ROOT / "roles" / "monitoring" / "files" / "raymetal-dcgm-counters.csv").read_text()
    rows = [[c.strip() for c in line.split(",", 2)] for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    return rows


def test_the_counters_file_is_dcgm_exporters_format_and_exports_what_the_alerts_read(rendered):
    rows = counters()
    assert all(len(r) == 3 and r[0].startswith("DCGM_FI_") and r[1] in ("gauge", "counter") and r[2] for r in rows), rows
    exported = {r[0] for r in rows}
    assert len(exported) == len(rows), "a field is listed twice"
    rules = (rendered / "raymetal-alerts.yml").read_text()
    used = set(re.findall(r"DCGM_FI_[A-Z0-9_]+", rules))
    assert used and used <= exported, sorted(used - exported)


def test_grafanas_data_source_is_the_prometheus_the_ray_dashboard_uses(rendered):
    doc = yaml.safe_load((rendered / "grafana-datasource.yml").read_text())
    assert doc["apiVersion"] == 1
    [source] = doc["datasources"]
    head = facts(rendered)["head"]
    assert source["url"] == head["monitoring_prometheus_url"] == "http://10.0.0.10:9090"
    # Ray's generated dashboards look the data source up by this name.
    assert source["name"] == "Prometheus" and source["type"] == "prometheus" and source["isDefault"] is True
    assert source["uid"] == "raymetal-prometheus"


def test_grafana_provisions_rays_dashboards_from_the_session_dir_and_ours_from_its_own(rendered):
    doc = yaml.safe_load((rendered / "grafana-dashboards.yml").read_text())
    providers = {p["name"]: p for p in doc["providers"]}
    assert sorted(providers) == ["ray", "raymetal"]
    assert all(p["type"] == "file" for p in providers.values())
    # Where Ray 2.60 writes them (its dashboard's metrics module: <temp dir>/session_latest/metrics/grafana/dashboards).
    assert providers["ray"]["options"]["path"] == "/var/lib/ray/tmp/session_latest/metrics/grafana/dashboards"
    assert providers["raymetal"]["options"]["path"] == "/var/lib/grafana/dashboards/raymetal"
    dropin = (rendered / "grafana.dropin.conf").read_text()
    assert "Environment=GF_SERVER_HTTP_ADDR=10.0.0.10\n" in dropin
    assert "Environment=GF_SERVER_HTTP_PORT=3000\n" in dropin
    assert "Environment=GF_ANALYTICS_REPORTING_ENABLED=false\n" in dropin


def test_the_gpu_fabric_dashboard_is_valid_and_reads_only_exported_series(rendered):
    dash = json.loads((ROOT / "roles" / "monitoring" / "files" / "raymetal-gpu-fabric.json").read_text())
    assert dash["uid"] == "raymetal-gpu-fabric" and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 8
    exported = {r[0] for r in counters()}
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "raymetal-prometheus", panel["title"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "raymetal-prometheus"
            fields = set(re.findall(r"DCGM_FI_[A-Z0-9_]+", target["expr"]))
            assert fields <= exported, (panel["title"], sorted(fields - exported))
            # every query is valid PromQL (promtool parses it as a rule expression)
    exprs = [t["expr"].replace("$__rate_interval", "5m").replace("$host", ".*")
             for p in dash["panels"] for t in p["targets"]]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": "dashboard:q%d" % i, "expr": e}
                                                         for i, e in enumerate(exprs)]}]}
    path = rendered / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    rc, out = run("check", "rules", str(path))
    assert rc == 0, out


def test_the_head_tells_its_dashboard_where_prometheus_and_grafana_are(rendered):
    head = (rendered / "ray.env.head").read_text().splitlines()
    assert "RAY_PROMETHEUS_HOST=http://10.0.0.10:9090" in head
    assert "RAY_GRAFANA_HOST=http://10.0.0.10:3000" in head
    # A browser reaches Grafana through the SSH tunnel the summary prints.
    assert "RAY_GRAFANA_IFRAME_HOST=http://127.0.0.1:3000" in head
    worker = (rendered / "ray.env.worker1").read_text()
    assert "RAY_GRAFANA_HOST" not in worker and "RAY_PROMETHEUS_HOST" not in worker


def test_grafana_has_no_default_admin_password_and_no_anonymous_viewer(rendered):
    """Was admin/admin with anonymous Viewer on (issue 35)."""
    env = dict(line.split("=", 2)[1:] for line in (rendered / "grafana.dropin.conf").read_text().splitlines()
               if line.startswith("Environment=GF_"))
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/etc/grafana/raymetal-admin-password"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    tasks = yaml.safe_load((ROOT / "roles" / "monitoring" / "tasks" / "grafana.yml").read_text())
    block = next(t for t in tasks if "block" in t)["block"]
    made = next(t for t in block if "ansible.builtin.set_fact" in t)
    assert made["no_log"] is True
    assert "lookup('ansible.builtin.password', monitoring_grafana_admin_password_file" in \
        made["ansible.builtin.set_fact"]["__monitoring_grafana_admin_password"]
    kept = next(t for t in block if t.get("register") == "__monitoring_grafana_password_file")
    assert kept["ansible.builtin.copy"]["mode"] == "0640" and kept["ansible.builtin.copy"]["owner"] == "root"
    assert kept["no_log"] is True and kept["diff"] is False
    reset = next(t for t in block if "grafana-cli" in str(t.get("ansible.builtin.command", "")))
    assert reset["no_log"] is True and "__monitoring_grafana_password_file is changed" in reset["when"]


def test_the_xid_alerts_split_the_xids_as_the_health_checks_do():
    """The role's XID lists (vars/main.yml) are raymetal_health's tables: one source of truth for both."""
    from ansible_collections.raymetal.cluster.plugins.module_utils import raymetal_health as health

    role_vars = yaml.safe_load((ROOT / "roles" / "monitoring" / "vars" / "main.yml").read_text())
    assert sorted(role_vars["__monitoring_xid_hardware"]) == sorted(health.XID_HARDWARE)
    assert sorted(role_vars["__monitoring_xid_application"]) == sorted(health.XID_APPLICATION)


def test_the_xid_rules_name_every_hardware_xid_and_skip_a_programs_own(rendered):
    rules = yaml.safe_load((rendered / "raymetal-alerts.yml").read_text())
    xid = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpuXidError"]
    by_severity = {r["labels"]["severity"]: r["expr"] for r in xid}
    assert set(by_severity) == {"critical", "warning"}
    assert sorted(int(x) for x in re.findall(r"== (\d+)", by_severity["critical"])) == [48, 62, 64, 74, 79, 92, 95, 119,
                                                                                        120, 140]
    assert "31" in re.findall(r"!= (\d+)", by_severity["warning"])
