"""Monitoring on the lab: Prometheus on the head (the monitoring host), node_exporter on every node.

Both came from the lab's apt mirror (lab/mirror-packages.txt) during the
shared `cluster` deploy; the lab inventory turns monitoring on with the
role's 15 s scrape interval and a 20 s RayNodeDown window. Prometheus's API is asked on
the head (its port is closed to everything else but loopback and admin networks).
"""

from __future__ import annotations

import json
import urllib.parse

from tests.lab import labkit

# On the built-in (Debian 12) lab of `make e2e`, which has the shorter list; it also passed on the Debian 13
# lab (Prometheus 2.53 and node_exporter 1.9 from its own mirror) when run there by hand.
E2E_LAB = 1

HEAD = labkit.HEAD
RAY_HEAD_JOBS = {"ray_autoscaler", "ray_dashboard"}
EVERY_NODE_JOBS = {"ray_node", "node"}
MONITORING_PLAY = "Install the monitoring where its inputs changed (node_exporter everywhere, Prometheus on the monitoring host)"


def prom(lab, path, **params):
    """GET Prometheus's API on the head at its fabric address; the decoded JSON."""
    url = f"http://{lab[HEAD]['lab_fabric_ip']}:9090{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    out = labkit.sh(HEAD, f"curl -sf -m 10 '{url}'").stdout
    return json.loads(out)


def targets(lab):
    """{(job, host): health} of every active target."""
    data = prom(lab, "/api/v1/targets", state="active")["data"]["activeTargets"]
    return {(t["labels"]["job"], t["labels"].get("host")): t["health"] for t in data}


def expected_targets(lab):
    want = {(job, name) for name in lab for job in EVERY_NODE_JOBS}
    want |= {(job, name) for name, hv in lab.items() if hv["group"] == "ray_head" for job in RAY_HEAD_JOBS}
    return want


def all_up(lab):
    now = targets(lab)
    return now if set(now) == expected_targets(lab) and set(now.values()) == {"up"} else False


main_pid = labkit.main_pid


def test_every_ray_and_node_exporter_target_is_up_for_every_node(cluster, lab):
    up = labkit.wait_until(lambda: all_up(lab), 90, interval=3, what="every target up")
    # 3 nodes: ray_node and node on each, the autoscaler and dashboard on the head.
    assert len(up) == 2 * len(lab) + 2, up


def test_a_ray_metric_has_one_series_per_node_labelled_with_its_host(cluster, lab):
    def series():
        result = prom(lab, "/api/v1/query", query='ray_node_mem_used{job="ray_node"}')["data"]["result"]
        hosts = sorted(r["metric"].get("host") for r in result)
        return hosts if hosts == sorted(lab) else False

    assert labkit.wait_until(series, 90, interval=3, what="ray_node_mem_used for every host") == sorted(lab)


def test_each_node_names_the_filesystem_of_its_ray_temp_dir_that_the_disk_alert_watches(cluster, lab):
    """RayTempDirFilling joins node_exporter's filesystems on raymetal_ray_temp_dir_mount: one series per node, in
    node_exporter's job, naming the mount point that holds the node's Ray temp dir as the node itself resolves it."""
    want = {name: labkit.sh(name, 'findmnt -n -o TARGET -T "$(sed -n "s/^RAY_TMPDIR=//p" /etc/ray/ray.env)"').stdout.strip()
            for name in lab}
    assert all(want.values()), want

    def series():
        result = prom(lab, "/api/v1/query", query='raymetal_ray_temp_dir_mount{job="node"} == 1')["data"]["result"]
        got = {r["metric"].get("host"): r["metric"].get("mountpoint") for r in result}
        return got if len(result) == len(lab) and got == want else False

    assert labkit.wait_until(series, 90, interval=3, what="raymetal_ray_temp_dir_mount for every host") == want


def test_the_dashboard_uses_this_prometheus(cluster, lab):
    env = labkit.sh(HEAD, "cat /etc/ray/ray.env").stdout
    assert f"RAY_PROMETHEUS_HOST=http://{lab[HEAD]['lab_fabric_ip']}:9090" in env
    worker_env = labkit.sh(labkit.WORKER1, "cat /etc/ray/ray.env").stdout
    assert "RAY_PROMETHEUS_HOST" not in worker_env
    out = labkit.sh(
        HEAD,
        "curl -s -m 10 -H \"Authorization: Bearer $(cat /etc/ray/auth_token)\" "
        f"http://{lab[HEAD]['lab_fabric_ip']}:8265/api/prometheus_health",
    ).stdout
    assert json.loads(out).get("result") is True, out


def test_metrics_ports_answer_the_monitoring_host_only(cluster, lab):
    worker1 = lab[labkit.WORKER1]["lab_fabric_ip"]
    head_ib = lab[HEAD]["lab_fabric_ip"]
    expected = {}
    for port in (6384, 9100):
        expected[(HEAD, worker1, port)] = "open"
        # Another cluster node and the controller (on the fabric bridge) are dropped.
        expected[(labkit.WORKER2, worker1, port)] = "timeout"
        expected[(None, worker1, port)] = "timeout"
    for port in (44217, 44227, 9100, 9090):
        expected[(None, head_ib, port)] = "timeout"
    # Prometheus: not even other cluster nodes (the tunnel arrives on the head itself).
    expected[(labkit.WORKER1, head_ib, 9090)] = "timeout"
    expected[(HEAD, head_ib, 9090)] = "open"
    answers = dict(zip(expected, labkit.probe_all(list(expected))))
    assert answers == expected


def test_a_stopped_worker_goes_down_and_fires_ray_node_down(cluster, lab):
    name = labkit.WORKER2

    def alert_firing():
        alerts = prom(lab, "/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "RayNodeDown"
                and a["labels"].get("host") == name and a["state"] == "firing"]

    labkit.wait_until(lambda: all_up(lab), 90, interval=3, what="every target up")
    labkit.sh(name, "systemctl stop ray-worker")
    try:
        labkit.wait_until(lambda: targets(lab)[("ray_node", name)] == "down", 60, interval=2,
                          what=f"ray_node target of {name} down")
        assert targets(lab)[("node", name)] == "up"
        # for: 20s in the lab inventory, evaluated every 15 s (the role's default scrape and evaluation interval).
        firing = labkit.wait_until(alert_firing, 90, interval=3, what=f"RayNodeDown firing for {name}")
        assert firing[0]["labels"]["job"] == "ray_node"
    finally:
        labkit.sh(name, "systemctl start ray-worker")
    labkit.wait_until(lambda: all_up(lab), 180, interval=3, what=f"{name} back up")


def test_rerun_changes_nothing_and_keeps_prometheus_running(cluster, lab, full_rerun):
    """site.yml again with every task (the session's shared full rerun, conftest.full_rerun: with the fast path
    none of the monitoring role's tasks would run): the role changes nothing and restarts neither Prometheus nor any
    node_exporter, and the summary names Prometheus, its targets and the tunnel."""
    run = full_rerun
    assert all(pid not in ("", "0") for pid in run.before.pids.values()), run.before.pids
    assert run.rc == 0, run.output[-3000:]
    assert all(c["changed"] == 0 for c in run.stats.values()), run.stats
    assert f"{HEAD}: Configure node_exporter" in run.ran and f"{labkit.WORKER1}: Configure node_exporter" in run.ran
    assert run.after.pids == run.before.pids
    # The summary names Prometheus, the tunnel and the targets.
    assert f"Prometheus: http://{lab[HEAD]['lab_fabric_ip']}:9090 on {HEAD}: {2 * len(lab) + 2}/{2 * len(lab) + 2} " \
           "targets up" in run.output
    assert f"-L 9090:{lab[HEAD]['lab_fabric_ip']}:9090" in run.output


# Every port the monitoring listens on where it runs: Prometheus, node_exporter, dcgm-exporter, Grafana, Alertmanager
# and its cluster port (the lab runs Prometheus, node_exporter and Alertmanager; the others are checked all the same).
MONITORING_PORTS = (9090, 9100, 9400, 3000, 9093, 9094)
MONITORING_UNITS = ("prometheus", "prometheus-node-exporter", "prometheus-alertmanager")


def listening_ports(name):
    """The TCP ports something listens on in a lab node (ss -ltnH: local address in column 4)."""
    lines = labkit.sh(name, "ss -ltnH").stdout.splitlines()
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in lines if line.split()}


# Last in this file: two deploys (the head's ray.env loses RAY_PROMETHEUS_HOST and gets it back, so Ray restarts
# twice), and the tests above need the monitoring on.
def test_monitoring_switched_off_stops_on_every_node_and_comes_back_when_on(cluster, lab):
    """Issue 35: monitoring_enabled false after true stopped nothing, and its ports left the firewall, so Prometheus
    and node_exporter became reachable from anyone on the fabric. Off: nothing of it listens anywhere, the outsider
    reaches none of its ports; on again: as before."""
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "monitoring_enabled=false")
    try:
        assert rc == 0, out[-3000:]
        listening = {name: sorted(listening_ports(name) & set(MONITORING_PORTS)) for name in lab}
        assert listening == {name: [] for name in lab}, listening
        for name in lab:
            state = labkit.sh(name, "systemctl is-active %s; systemctl is-enabled %s"
                              % (" ".join(MONITORING_UNITS), " ".join(MONITORING_UNITS)), check=False).stdout.split()
            # prometheus is installed on the head only: is-enabled says nothing for a unit that is not there on
            # Debian 12's systemd (252), "not-found" on Debian 13's (257).
            assert set(state) <= {"inactive", "disabled", "not-found"}, (name, state)
        with labkit.outsider_on_fabric(lab, "monitoring-outsider", 202) as outsider:
            reached = {(name, port): labkit.probe_from(outsider, hv["lab_fabric_ip"], port, timeout=2)
                       for name, hv in lab.items() for port in MONITORING_PORTS}
        assert [key for key, answer in reached.items() if answer == "open"] == [], reached
    finally:
        ran = set()  # (play, host) of every task result

        def on_event(event):
            if str(event.get("event", "")).startswith("runner_on_"):
                data = event.get("event_data") or {}
                ran.add((data.get("play"), data.get("host")))

        rc_on, out_on, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, on_event=on_event)
    assert rc_on == 0, out_on[-3000:]
    # The full path per role: the monitoring's inputs differ from the record, so its play runs on every node (and
    # on none where they do not: tests/lab/test_firewall.py).
    assert {host for play, host in ran if play == MONITORING_PLAY} == set(lab), sorted(ran)
    labkit.wait_until(lambda: all_up(lab), 120, interval=3, what="every target up again")
    assert all(main_pid(name, "prometheus-node-exporter") not in ("", "0") for name in lab)
    # Alertmanager is back on the monitoring host, on loopback only (molecule's monitoring scenario follows an
    # alert through it to a webhook).
    assert main_pid(HEAD, "prometheus-alertmanager") not in ("", "0")
    on_head = labkit.sh(HEAD, "ss -ltnH").stdout
    assert "127.0.0.1:9093 " in on_head and ":9094 " not in on_head, on_head
