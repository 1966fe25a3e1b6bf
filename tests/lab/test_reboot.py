"""Failures the cluster recovers from by itself: a node that reboots (a clean shutdown of the container, then a
boot) comes back into the cluster; a GCS killed with -9 restarts the head at once and every worker rejoins.

The lab's image renames the fabric NIC to ib0 at every boot (a real NIC keeps its name), the Ray unit is
enabled, the firewall unit reloads the rules, and the worker waits for the head and rejoins.
"""

from __future__ import annotations

import subprocess
import time

from tests.lab import labkit

# On the first lab of `make e2e` (tools/e2e.sh): it restarts, kills and freezes nodes, and waits until they
# are back; it moved from lab 2 when the health loop's test (test_health.py) went there, so that the labs end together.
E2E_LAB = 1

P = labkit.LAB_PREFIX
HEAD = f"{P}-head"


def test_a_rebooted_worker_rejoins_with_its_fabric_nic_and_firewall(cluster, lab):
    name = f"{P}-worker2"
    ip = lab[name]["lab_fabric_ip"]
    assert labkit.raylet_registered(lab, name)
    # Two stops by itself in the restart backoff's record: the shutdown stops Ray deliberately (systemd runs the
    # unit's ExecStop while Ray still runs), which clears them; were it counted as Ray's own, they would stay.
    earlier = time.time() - 60
    labkit.set_restart_record(name, {"stops": [earlier - 30, earlier], "stopping": False})
    start = time.monotonic()
    # A clean reboot: systemd stops every unit in order and the container ends, then it boots again. (docker
    # restart is a power cut: systemd as PID 1 takes docker's SIGTERM as "re-execute", and docker kills the
    # container when its -t runs out.)
    labkit.sh(name, "systemctl --no-block poweroff")
    subprocess.run(["docker", "wait", name], check=True, capture_output=True, timeout=180)
    labkit.start_node(name)
    labkit.wait_until(lambda: labkit.sh(name, "ip -4 -o addr show ib0", check=False).stdout.count(ip) == 1, 60,
                      what=f"{name}: ib0 carries {ip} after the reboot")
    # Its new raylet, not the one before the reboot, which the GCS may list a little longer.
    labkit.wait_until(lambda: labkit.raylet_registered(lab, name), 240, interval=3, what=f"{name} alive again")
    print(f"\n{name}: poweroff, boot -> alive Ray node again in {time.monotonic() - start:.1f} s")
    assert labkit.sh(name, "systemctl is-active ray-worker").stdout.strip() == "active"
    assert earlier not in labkit.restart_record(name).get("stops", []), labkit.restart_record(name)
    # No ordering cycle in what its boot starts: systemd breaks one by dropping a job, any one (a shared storage mount
    # unit ordered after the network once dropped the unit that names the lab's fabric NIC, and Ray never started).
    # The boot's own message is lost in a container (no /dev/kmsg before journald starts): systemd-analyze sees it.
    verify = labkit.sh(name, "systemd-analyze verify multi-user.target 2>&1", check=False).stdout
    assert "ordering cycle" not in verify, [line for line in verify.splitlines() if "cycle" in line]
    # The firewall came back with it: the raylet is still closed to the management network.
    assert labkit.probe_from_controller(lab[name]["ansible_host"], 6380) == "timeout"
    assert len(labkit.alive_ips(lab)) == len(lab)


def test_a_gcs_killed_with_sigkill_brings_the_whole_cluster_back(cluster, lab):
    """kill -9 of the GCS: the head's unit restarts at once (no stop timeout), the workers rejoin the new GCS."""
    workers = [name for name in lab if name != HEAD]
    # A GCS restarted without the cluster's state is found out by each raylet's liveness check ("wrong cluster"),
    # which Ray runs every 60 s by default: the workers could stay out that long (bench/operations measured 66 s
    # to every node alive). The running raylets check every ray_liveness_check_interval (5 s).
    for name in workers:
        # Every raylet a member of this GCS first: one still registering when the GCS dies (a worker restarted
        # by the test before this one) fails its registration, a crash, not the check this test is about.
        labkit.wait_until(lambda: labkit.raylet_registered(lab, name), 120, interval=1,
                          what=f"{name}'s running raylet registered with the GCS")
        env = labkit.sh(name, "tr '\\0' '\\n' < /proc/$(pgrep -x raylet)/environ").stdout.split()
        assert "RAY_raylet_liveness_self_check_interval_ms=5000" in env, (name, env)
    before = labkit.alive_nodes(lab)
    assert len(before) == len(lab), before
    since = labkit.sh(HEAD, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    start, killed = time.monotonic(), time.time()
    labkit.sh(HEAD, "kill -9 $(pgrep -x gcs_server)")
    back = {}

    def every_node_rejoined():
        now = labkit.alive_nodes(lab)
        for ip, node_id in now.items():
            if node_id not in before.values():
                back.setdefault(ip, round(time.monotonic() - start, 1))
        return len(back) == len(lab)

    labkit.wait_until(every_node_rejoined, 240, interval=2, what="every node back in a new cluster after kill -9 of the GCS")
    print(f"\nkill -9 gcs_server -> head back in {back[lab[HEAD]['lab_fabric_ip']]} s, every node in "
          f"{max(back.values())} s ({back})")
    journal = labkit.sh(HEAD, f"journalctl -u ray-head --no-pager --since '{since}'").stdout
    # Ray ended the rest itself; nothing was left to wait for (with KillMode=control-group, orphaned workers that
    # ignore SIGTERM held the unit for TimeoutStopSec, 60 s, before systemd could restart it).
    assert "Remaining processes will be killed" in journal, journal[-3000:]
    assert "timed out" not in journal and "Failed with result" not in journal, journal[-3000:]
    # The backoff counted that stop as Ray's own (ExecStop saw no main process), and one such stop waits for nothing.
    record = labkit.restart_record(HEAD)
    assert record.get("stopping") is False and any(t >= killed - 1 for t in record.get("stops", [])), record
    assert "starting it again in" not in journal, journal[-3000:]
    # Each worker left the old cluster because that check found the new GCS (not a timeout, not a crash).
    for name in workers:
        events = labkit.sh(name, f"find /var/lib/ray/tmp -path '*/events/event_RAYLET.log' -newermt '{since}'"
                                 " -exec cat {} +", check=False).stdout
        assert "GCS returned an authentication error" in events, (name, events[-2000:])


def test_a_worker_frozen_mid_run_is_named_within_a_bounded_wait_and_the_others_are_untouched(cluster, lab):
    """A worker that hangs during site.yml (docker pause as the nodes are being prepared: its kernel still
    answers TCP, nothing else does): the run names it UNREACHABLE and ends within a bounded time (it used to
    wait 357 s), changing and restarting nothing on the other nodes. Frozen before the run, validation
    names it at once (tests/lab/test_validate.py)."""
    name = f"{P}-worker2"
    others = [h for h in lab if h != name]
    before = labkit.invocation_ids(lab, others)
    frozen_at = []

    def freeze_when_preparing(event):
        # ansible-runner hands each event over as it happens: pause the worker as the prepare play starts.
        if (not frozen_at and event.get("event") == "playbook_on_play_start"
                and (event.get("event_data") or {}).get("play") == "Prepare every node"):
            subprocess.run(["docker", "pause", name], check=True, capture_output=True)
            frozen_at.append(time.monotonic())

    try:
        # Every node takes the full path, so the prepare play runs on the worker (with the fast path, a node that
        # matches its record skips it; this test ran after a docker restart that had left the worker differing).
        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "raymetal_fast_path=false",
                                             on_event=freeze_when_preparing)
    finally:
        subprocess.run(["docker", "unpause", name], check=False, capture_output=True)
    assert frozen_at, out[-3000:]
    took = time.monotonic() - frozen_at[0]
    print(f"\nsite.yml with {name} frozen as the nodes were prepared: exit {rc}, {took:.1f} s after the freeze")
    assert rc != 0, out[-3000:]
    assert f"fatal: [{name}]: UNREACHABLE!" in out, out[-3000:]
    assert stats[name]["unreachable"] >= 1, stats
    assert all(stats[h]["changed"] == 0 for h in others), stats
    assert labkit.invocation_ids(lab, others) == before, "another node restarted"
    assert took < 150, f"the run waited {took:.0f} s for a frozen host"
    labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, interval=3,
                      what=f"{name} alive again after it was thawed")
