"""Unit tests for plugins/filter/monitoring.py and the firewall's metrics-only plan."""

from __future__ import annotations

import pathlib

from ansible_collections.raymetal.cluster.plugins.filter import firewall as fw
from ansible_collections.raymetal.cluster.plugins.filter import monitoring as mon

ROOT = pathlib.Path(__file__).resolve().parents[4]

PORTS = [
    {"name": "gcs", "port": 6379, "scope": "head"},
    {"name": "metrics_export", "port": 6384, "scope": "all", "metrics": True},
    {"name": "autoscaler_metrics", "port": 44217, "scope": "head", "metrics": True},
    {"name": "node_manager", "port": 6380},
]


def test_the_monitoring_host_is_scraped_by_nobody_else_and_workers_only_on_their_ports():
    hostvars = {"h": {"ray_ports": PORTS}, "w": {"ray_ports": PORTS}}
    jobs = mon.monitoring_scrape_targets(["w", "h"], hostvars, {"h": "10.0.0.1", "w": "10.0.0.2"}, ["h"], 9100)
    assert jobs == {
        "node": [{"targets": ["10.0.0.1:9100"], "labels": {"host": "h", "ray_role": "head"}},
                 {"targets": ["10.0.0.2:9100"], "labels": {"host": "w", "ray_role": "worker"}}],
        "ray_autoscaler": [{"targets": ["10.0.0.1:44217"], "labels": {"host": "h", "ray_role": "head"}}],
        "ray_node": [{"targets": ["10.0.0.1:6384"], "labels": {"host": "h", "ray_role": "head"}},
                     {"targets": ["10.0.0.2:6384"], "labels": {"host": "w", "ray_role": "worker"}}],
    }


def test_a_host_without_an_address_is_named():
    try:
        mon.monitoring_scrape_targets(["w"], {"w": {}}, {}, [], 9100)
    except ValueError as exc:
        assert "w" in str(exc)
    else:
        raise AssertionError("no error for a host without an address")


def test_prometheus_is_closed_to_the_cluster_on_the_head_and_open_to_it_elsewhere():
    assert mon.monitoring_ports(False, False, 9090, 9100) == [
        {"name": "node_exporter", "port": 9100, "proto": "tcp", "scope": "all", "metrics": True}]
    on_head = mon.monitoring_ports(True, True, 9090, 9100)[1]
    assert on_head == {"name": "prometheus", "port": 9090, "proto": "tcp", "scope": "closed", "admin": True}
    assert mon.monitoring_ports(True, False, 9090, 9100)[1]["scope"] == "all"


def test_targets_summary_counts_and_names_the_down_ones():
    answer = {"data": {"activeTargets": [
        {"health": "up", "labels": {"job": "node", "host": "h"}},
        {"health": "down", "labels": {"job": "ray_node", "host": "w"}, "lastError": "connection refused"},
        {"health": "unknown", "labels": {"job": "node", "host": "w"}},
    ]}}
    assert mon.monitoring_targets_summary(answer) == {
        "up": 1, "total": 3, "down": ["node w (unknown)", "ray_node w (connection refused)"]}
    assert mon.monitoring_targets_summary(None) == {"up": 0, "total": 0, "down": []}


def test_tunnel_command_uses_how_ansible_reaches_the_host():
    cmd = mon.monitoring_tunnel_command("10.0.0.1", 9090, {
        "host": "192.0.2.1", "user": "root", "port": 2222, "key": "/repo/lab/key", "cwd": "/repo",
        "common_args": "-o StrictHostKeyChecking=no"})
    assert cmd == ("ssh -N -o ExitOnForwardFailure=yes -L 9090:10.0.0.1:9090 -p 2222 -i lab/key "
                   "-o StrictHostKeyChecking=no root@192.0.2.1")


def test_metrics_only_keeps_metrics_ports_from_the_cluster_and_opens_them_to_the_scrapers():
    cluster = fw.firewall_split_sources(["10.0.0.1", "10.0.0.2"])
    scrapers = fw.firewall_split_sources([], ["10.0.0.1"])
    plan = fw.firewall_rule_plan(PORTS, "worker", "ib0", cluster, None, scrapers, True)
    allowed = {(r["name"], r["source"]) for r in plan if r["action"] == "allow"}
    assert ("metrics_export", "10.0.0.1") in allowed
    assert ("metrics_export", "10.0.0.2") not in allowed
    assert ("node_manager", "10.0.0.2") in allowed
    # Without it, as before: metrics ports are open to the cluster.
    plan = fw.firewall_rule_plan(PORTS, "worker", "ib0", cluster, None, scrapers)
    allowed = {(r["name"], r["source"]) for r in plan if r["action"] == "allow"}
    assert ("metrics_export", "10.0.0.2") in allowed


def test_dcgm_exporter_is_scraped_where_the_preflight_turned_it_on_only():
    hostvars = {"h": {"ray_ports": PORTS}, "g": {"ray_ports": PORTS, "__monitoring_dcgm_on": True},
                "s": {"ray_ports": PORTS, "__monitoring_dcgm_on": "False"}}
    jobs = mon.monitoring_scrape_targets(["g", "h", "s"], hostvars, {"h": "10.0.0.1", "g": "10.0.0.2", "s": "fd00::3"},
                                         ["h"], 9100, 9400)
    assert jobs["gpu"] == [{"targets": ["10.0.0.2:9400"], "labels": {"host": "g", "ray_role": "worker"}}]
    # Without a port (callers from before DCGM), no gpu job at all.
    assert "gpu" not in mon.monitoring_scrape_targets(["g"], hostvars, {"g": "10.0.0.2"}, [], 9100)


def test_dcgm_and_grafana_ports_follow_the_metrics_and_admin_rules():
    ports = {p["name"]: p for p in mon.monitoring_ports(True, False, 9090, 9100, 9400, 3000)}
    assert ports["dcgm_exporter"] == {"name": "dcgm_exporter", "port": 9400, "proto": "tcp", "scope": "all",
                                      "metrics": True}
    # Not on the head: the head's dashboard must reach Grafana over the fabric.
    assert ports["grafana"] == {"name": "grafana", "port": 3000, "proto": "tcp", "scope": "all", "admin": True}
    assert {p["name"] for p in mon.monitoring_ports(False, False, 9090, 9100, None, 3000)} == {"node_exporter"}


def test_the_target_files_are_one_node_files_entry_per_job_with_the_targets_as_yaml():
    import yaml

    jobs = {"ray_node": [{"targets": ["10.0.0.2:6384"], "labels": {"host": "w1"}}],
            "node": [{"targets": ["10.0.0.1:9100"], "labels": {"host": "head"}}]}
    files = mon.monitoring_target_files(jobs, "/etc/prometheus/raymetal/targets/")
    assert [f["path"] for f in files] == ["/etc/prometheus/raymetal/targets/node.yml",
                                         "/etc/prometheus/raymetal/targets/ray_node.yml"]
    assert all((f["owner"], f["group"], f["mode"]) == ("root", "root", "0644") for f in files)
    assert files[0]["content"].startswith("# Managed by Ansible (raymetal monitoring role)")
    assert yaml.safe_load(files[1]["content"]) == jobs["ray_node"]
    # As the copy task wrote them before (the role's to_nice_yaml(indent=2) under the header), so that an upgrade
    # rewrites none: a file taken from the lab's monitoring host.
    assert files[0]["content"] == (
        "# Managed by Ansible (raymetal monitoring role); local edits are overwritten.\n"
        "- labels:\n    host: head\n  targets:\n  - 10.0.0.1:9100\n")
    assert mon.monitoring_target_files({}, "/x") == []
