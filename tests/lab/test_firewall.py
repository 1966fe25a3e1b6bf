"""The firewall on the lab, proved with real TCP connections.

Ray 2.60 listens on 0.0.0.0 for the GCS and raylet ports whatever
--node-ip-address says, so only the firewall keeps them off the management
network and away from hosts that are not in the inventory.
"""

from __future__ import annotations

import socket

import pytest

from tests.lab import labkit

# The Debian 13 lab of `make e2e` (nftables 1.1 there; tools/e2e.sh).
E2E_LAB = 2

HEAD = labkit.HEAD
# The plays of playbooks/apply.yml that apply one role on the nodes whose inputs for it changed.
FIREWALL_PLAY = "Apply the firewall where its inputs changed"
HEALTH_PLAY = "Run the node health loop where its inputs changed"
MONITORING_PLAY = "Install the monitoring where its inputs changed (node_exporter everywhere, Prometheus on the monitoring host)"


@pytest.fixture(scope="module")
def outsider(lab):
    """A container on the fabric network that is not in the inventory."""
    with labkit.outsider_on_fabric(lab, "outsider", 200) as container:
        yield container


def test_cluster_nodes_reach_the_head_over_the_fabric(cluster, lab):
    head_ib = lab[HEAD]["lab_fabric_ip"]
    for port in (6379, 8265):
        assert labkit.probe_from(labkit.WORKER1, head_ib, port) == "open", port
    # Head to a worker's raylet, the other direction.
    assert labkit.probe_from(HEAD, lab[labkit.WORKER1]["lab_fabric_ip"], 6380) == "open"


def test_management_network_cannot_reach_ray(cluster, lab):
    head_mgmt = lab[HEAD]["ansible_host"]
    probes = [(source, head_mgmt, port) for port in (6379, 8265, 6380, 52365) for source in (labkit.WORKER1, None)]
    answers = labkit.probe_all(probes)
    assert answers == ["timeout"] * len(probes), list(zip(probes, answers))


def test_a_host_outside_the_inventory_is_dropped_on_the_fabric(cluster, lab, outsider):
    head_ib = lab[HEAD]["lab_fabric_ip"]
    probes = [(outsider, head_ib, port) for port in (6379, 8265, 10001, 52365)]
    probes.append((outsider, lab[labkit.WORKER2]["lab_fabric_ip"], 6380))
    answers = labkit.probe_all(probes)
    assert answers == ["timeout"] * len(probes), list(zip(probes, answers))


def test_the_ray_client_port_is_closed_even_to_cluster_nodes(cluster, lab):
    assert labkit.probe_from(labkit.WORKER1, lab[HEAD]["lab_fabric_ip"], 10001) == "timeout"
    # Ray does listen there (on ib0 and loopback): the firewall is what closes it.
    assert labkit.probe_from(HEAD, "127.0.0.1", 10001) == "open"


def test_ssh_still_reaches_every_node(cluster, lab):
    for name, hvars in lab.items():
        with socket.create_connection((hvars["ansible_host"], 22), timeout=5) as conn:
            assert conn.recv(64).startswith(b"SSH-2.0"), name


def test_members_only_closes_a_user_jobs_port_to_outsiders_on_the_fabric(cluster, lab, outsider):
    """firewall_fabric_members_only: a port that no Ray setting names (a Serve app, a rendezvous) is
    open to outsiders on the fabric by default and closed to them with the option; members still reach
    it, SSH stays open, and Ray is not restarted by the change."""
    name, port = labkit.WORKER2, 23456  # outside every Ray port and the worker port range
    ip = lab[name]["lab_fabric_ip"]
    labkit.sh(name, f"systemd-run --unit raymetal-test-listener python3 -m http.server {port} --bind {ip}")
    try:
        labkit.wait_until(lambda: labkit.probe_from(labkit.WORKER1, ip, port) == "open", 30, what="the listener")
        assert labkit.probe_from(outsider, ip, port) == "open"
        before = labkit.invocation_ids(lab)
        ran, plays = set(), set()  # (play, host) of every task result: which nodes each play touched

        def on_event(event):
            if event.get("event") == "playbook_on_play_start":
                plays.add((event.get("event_data") or {}).get("play"))
            elif str(event.get("event", "")).startswith("runner_on_"):
                data = event.get("event_data") or {}
                ran.add((data.get("play"), data.get("host")))

        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e",
                                             '{"firewall_fabric_members_only": true}', on_event=on_event)
        assert rc == 0, out[-3000:]
        # The full path per role: a setting of the firewall alone runs the firewall's play on every node and every
        # other role's play of its own (the fabric, the shared storage, Redis, the monitoring, the health loop) on
        # none (their inputs are as recorded), so those nodes queue none of their tasks.
        assert {host for play, host in ran if play == FIREWALL_PLAY} == set(lab), sorted(ran)
        gated = {play for play in plays if play and "where its inputs changed" in play} - {FIREWALL_PLAY}
        assert {HEALTH_PLAY, MONITORING_PLAY} <= gated and len(gated) >= 5, sorted(plays)
        assert [(play, host) for play, host in ran if play in gated] == [], sorted(ran)
        assert labkit.probe_from(outsider, ip, port) == "timeout"
        assert labkit.probe_from(labkit.WORKER1, ip, port) == "open"
        assert labkit.probe_from(HEAD, ip, port) == "open"
        assert labkit.probe_from(outsider, ip, 22) == "open"
        assert labkit.invocation_ids(lab) == before
    finally:
        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        labkit.sh(name, "systemctl stop raymetal-test-listener", check=False)
    assert rc == 0, out[-3000:]
    # Back to the default: outsiders reach unlisted ports again, Ray's stay closed to them.
    labkit.sh(name, f"systemd-run --unit raymetal-test-listener python3 -m http.server {port} --bind {ip}")
    try:
        labkit.wait_until(lambda: labkit.probe_from(outsider, ip, port) == "open", 30, what="the default table")
        assert labkit.probe_from(outsider, ip, 6380) == "timeout"
    finally:
        labkit.sh(name, "systemctl stop raymetal-test-listener", check=False)


def test_without_the_firewall_the_same_probe_gets_through(cluster, lab):
    """The blocked probes above would pass without the firewall: prove it on one node."""
    name = labkit.WORKER2
    mgmt = lab[name]["ansible_host"]
    assert labkit.probe_from_controller(mgmt, 6380) == "timeout"
    labkit.sh(name, "nft delete table inet raymetal")
    try:
        assert labkit.probe_from_controller(mgmt, 6380) == "open"
    finally:
        labkit.sh(name, "systemctl restart raymetal-firewall.service")
    assert labkit.probe_from_controller(mgmt, 6380) == "timeout"
