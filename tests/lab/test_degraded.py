"""A fleet is never whole: with raymetal_max_unreachable a deploy goes on without unreachable workers within the
budget, names them, converges every other node without restarting Ray there, and keeps the left-out worker's
address in the firewall and Prometheus so that it rejoins; over the budget, or without the head, it stops before
any change. The worker back, the next deploy takes the full path (saying why) and the one after it the fast path.

The lab has a head and two workers (the issue's lab has four): "two unreachable with a budget of one" stops both
workers. The head is made unreachable by freezing its container (docker pause) for the few seconds validation
takes, so that Ray on it is not restarted. A stopped worker comes back through labkit.start_node, which keeps its
NIC names (Docker attaches the lab's networks in either order at a start).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile

from raymetal.runner import deploy
from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): it stops workers and freezes the head for a few seconds. Moved
# from lab 1, whose tests took 45.3 minutes with test_status_report (2.5) against lab 2's 41.9 without it (run35).
E2E_LAB = 2

HEAD = labkit.HEAD
# Short SSH timeouts for the runs that find a frozen or stopped host (the lab's ansible.cfg waits 30 s).
QUICK = "ansible_timeout=5"


def flat(text):
    """Ansible's YAML output folds long messages: compare them with single spaces."""
    return " ".join(text.split())


def docker(*args):
    subprocess.run(["docker", *args], check=True, capture_output=True, timeout=120)


def test_a_deploy_goes_on_without_an_unreachable_worker_within_the_budget_and_it_rejoins(cluster, lab):
    gone = labkit.WORKER2
    others = [name for name in lab if name != gone]
    gone_ip = lab[gone]["lab_fabric_ip"]
    # Every node as its record says (the fast path when it already is): the head's record of the last deploy
    # holds every member's address.
    deploy(str(labkit.LAB_INVENTORY))
    before = labkit.invocation_ids(lab, others)
    docker("stop", "-t", "10", gone)
    try:
        # Within a budget of 1: exit 4 (Ansible's code for unreachable hosts), the worker named with ssh's reason,
        # every other node converged and nothing restarted there.
        # QUICK: the first contact with the stopped worker waits for the connect timeout (its address answers no
        # ARP), the lab's 30 s otherwise; later runs get "No route to host" at once. No deploy input either.
        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "raymetal_max_unreachable=1",
                                             "-e", QUICK)
        assert rc == 4, out[-3000:]
        assert stats[gone]["unreachable"] >= 1 and stats[gone]["failed"] == 0, stats
        assert all(stats[n]["failed"] == 0 and stats[n]["unreachable"] == 0 and stats[n]["changed"] == 0
                   for n in others), stats
        assert "1 unreachable worker(s) left out of this deploy (raymetal_max_unreachable=1)" in flat(out), out[-3000:]
        assert "Left out of the cluster by this run (not converged, not waited for):" in flat(out)
        assert f"{gone}: unreachable (ansible_host={lab[gone]['ansible_host']}: ssh: connect to host" in flat(out)
        # The budget is no input of the deploy (it changes nothing on a node): the head converges, the other
        # worker, unchanged since the last deploy, keeps the fast path.
        assert (f"The full path runs on 1 host(s), the head and those that differ: {HEAD}. The other 1 keep what the "
                f"last deploy applied (the fast path): {labkit.WORKER1}.") in flat(out), out[-3000:]
        assert labkit.invocation_ids(lab, others) == before, "Ray restarted on a node that stayed"
        # Its last known address stays in every firewall's member set and in Prometheus's targets.
        for name in others:
            assert gone_ip in labkit.sh(name, "nft list table inet raymetal").stdout, name
        monitoring = labkit.sh(HEAD, "cat /etc/prometheus/raymetal/targets/*.yml 2>/dev/null || true").stdout
        if monitoring:
            assert gone_ip in monitoring
        # The Python API returns the cluster of a degraded deploy, naming the worker left out.
        facts = deploy(str(labkit.LAB_INVENTORY), {"raymetal_max_unreachable": 1})
        assert list(facts["left_out"]) == [gone], facts["left_out"]
        # status.yml names it with the reason the last deploy recorded.
        rc, out, _ = labkit.run_playbook("playbooks/status.yml", labkit.LAB_INVENTORY, "-e", "raymetal_status_report_only=true")
        assert rc == 0 and f"left out 1 worker(s), which took none of its changes: {gone}: unreachable (ansible_host=" in flat(out), out[-3000:]

        # Without a budget (the default 0): refused before any change, naming the host and the variable.
        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        assert rc == 2 and all(s["changed"] == 0 for s in stats.values()), (rc, stats)
        assert "1 host(s) cannot be reached, so nothing was changed anywhere" in flat(out) and gone in flat(out)
        assert "The budget (raymetal_max_unreachable=0) allows 0 of the 2 worker(s) to be left out" in flat(out)

        # Two unreachable with a budget of 1: refused.
        docker("stop", "-t", "10", labkit.WORKER1)
        try:
            rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "raymetal_max_unreachable=1",
                                                 "-e", QUICK)
            assert rc == 2 and all(s["changed"] == 0 for s in stats.values()), (rc, stats)
            assert "2 host(s) cannot be reached" in flat(out) and "(raymetal_max_unreachable=1) allows 1 of the 2 worker(s)" in flat(out), out[-3000:]
        finally:
            labkit.start_node(labkit.WORKER1)

        # The head unreachable (frozen for the few seconds validation takes): refused whatever the budget.
        head_before = labkit.invocation_ids(lab, [HEAD])
        # SSH connections of this run's own: a frozen host's kernel still accepts TCP, and a request over the
        # multiplexed connection an earlier run left open (ControlPersist) would wait for ServerAlive to give up
        # (45 s, with the head frozen all along) instead of the 5 s connect timeout. Short: a socket path's limit.
        fresh = tempfile.mkdtemp(prefix="rmcp-", dir="/tmp")
        docker("pause", HEAD)
        try:
            rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "raymetal_max_unreachable=2",
                                                 "-e", QUICK, "-e", f"ansible_control_path_dir={fresh}")
        finally:
            docker("unpause", HEAD)
            shutil.rmtree(fresh, ignore_errors=True)
        assert rc == 2 and all(s["changed"] == 0 for s in stats.values()), (rc, stats)
        assert f"{HEAD} is the head" in flat(out), out[-3000:]
        assert labkit.invocation_ids(lab, [HEAD]) == head_before
    finally:
        labkit.start_node(gone)
    # Back: Ray's unit starts at boot and the worker rejoins; worker1 (stopped above) too.
    labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, interval=3, what="every node alive again")
    # The next deploy takes the full path, and says the worker was left out of the last one.
    rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out[-3000:]
    assert f"left out of the last deploy (unreachable then): {gone}" in flat(out), out[-3000:]
    # The one after it is the fast path everywhere.
    rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0 and all(s["changed"] == 0 for s in stats.values()), stats
    assert f"Every one of the {len(lab)} host(s) matches what the last deploy applied" in flat(out), out[-3000:]
