"""playbooks/upgrade.yml between two real Ray releases, as docs/operations.md gives it.

The session's lab runs Ray 2.60.0. The test moves it to the older release in
lab/lab.sh's second wheelhouse (wheelhouse-ray-2.59.0: the lab's wheels plus
Ray 2.59.0), then upgrades it back to 2.60.0 with a job running, as a site
would go from 2.59.0 to 2.60.0; then makes the new version fail to start on
one worker and checks that the upgrade rolls every node back. Each upgrade
prints its downtime (the playbook measures it: from the stop to every node
alive). The lab is left on 2.60.0.
"""

from __future__ import annotations

import os
import re
import uuid

from tests.lab import labkit

# A test of its own lab: it stops the whole cluster three times.
E2E_LAB = 2

HEAD, WORKER1 = labkit.HEAD, labkit.WORKER1
NEW, OLD = "2.60.0", os.environ.get("LAB_OLD_RAY_VERSION", "2.59.0")
CACHE = os.environ.get("RAYMETAL_CACHE") or os.path.expanduser("~/.cache/raymetal")
OLD_WHEELHOUSE = os.path.join(CACHE, f"wheelhouse-ray-{OLD}")
TOKEN_ENV = "set -a; . /etc/ray/ray.env; set +a"
# What the unit runs, and what ray_venv_path points at.
UNIT_VENV = r"/opt/ray/venv-(\d+\.\d+\.\d+)/bin/ray start"


def upgrade(lab, version, *extra, on_event=None):
    args = ["-e", f"ray_version={version}", "-e", "upgrade_confirm=yes", *extra]
    if version == OLD:
        args += ["-e", f"ray_wheelhouse_src={OLD_WHEELHOUSE}"]
    return labkit.run_playbook("playbooks/upgrade.yml", labkit.LAB_INVENTORY, *args, on_event=on_event)


def versions(lab):
    """Per node: the version its unit runs and the one ray_venv_path points at."""
    found = {}
    for name in lab:
        unit = labkit.sh(name, f"systemctl cat {labkit.unit_of(lab, name)}").stdout
        link = labkit.sh(name, "readlink /opt/ray/venv").stdout.strip()
        found[name] = (re.search(UNIT_VENV, unit).group(1), link.rsplit("-", 1)[-1])
    return found


def api_version(lab):
    ip = lab[HEAD]["lab_fabric_ip"]
    return labkit.sh(HEAD, f"curl -s -m 10 -H \"Authorization: Bearer $(cat /etc/ray/auth_token)\" "
                           f"http://{ip}:8265/api/version").stdout


def downtime(out):
    match = re.search(r"Downtime: ([0-9.]+) s", " ".join(out.split()))
    assert match, out[-3000:]
    return float(match.group(1))


def submit_sleeper(lab):
    job_id = f"raymetal-upgrade-{uuid.uuid4().hex[:8]}"
    ip = lab[HEAD]["lab_fabric_ip"]
    labkit.sh(HEAD, f"{TOKEN_ENV}; cd /tmp && /opt/ray/venv/bin/ray job submit --address http://{ip}:8265 --no-wait "
                    f"--submission-id {job_id} -- python -c 'import time; time.sleep(900)'")
    return job_id


def job_running(lab, job_id):
    ip = lab[HEAD]["lab_fabric_ip"]
    out = labkit.sh(HEAD, f"curl -s -m 10 -H \"Authorization: Bearer $(cat /etc/ray/auth_token)\" "
                          f"http://{ip}:8265/api/jobs/{job_id}", check=False).stdout
    return '"RUNNING"' in out


def test_upgrade_from_the_older_release_lists_the_jobs_and_a_failed_start_rolls_back(cluster, lab):
    all_alive = {h["lab_fabric_ip"] for h in lab.values()}
    try:
        # The cluster as a site on the older release has it.
        rc, out, _ = upgrade(lab, OLD)
        assert rc == 0, out[-3000:]
        assert versions(lab) == {name: (OLD, OLD) for name in lab}
        assert OLD in api_version(lab)
        assert labkit.alive_ips(lab) == all_alive
        figures = {f"{NEW} -> {OLD}": downtime(out)}

        # Upgrade to the new release with a job running: the job is named before the stop.
        # The health loop is paused from before the stop until the wait is over (no round re-admits or quarantines
        # a node while Ray is switched), and runs again after.
        job_id = submit_sleeper(lab)
        labkit.wait_until(lambda: job_running(lab, job_id), 120, what=f"job {job_id} RUNNING")
        loop_during_switch = {}

        def read_the_loop(event):
            if (not loop_during_switch and event.get("event") == "playbook_on_play_start"
                    and (event.get("event_data") or {}).get("play") == "Switch every node to the new version and start it"):
                loop_during_switch.update({name: labkit.sh(name, "systemctl is-active raymetal-health.service",
                                                           check=False).stdout.strip() for name in lab})

        rc, out, _ = upgrade(lab, NEW, on_event=read_the_loop)
        assert rc == 0, out[-3000:]
        assert loop_during_switch == {name: "inactive" for name in lab}, loop_during_switch
        loop_after = {name: labkit.sh(name, "systemctl is-active raymetal-health.service", check=False).stdout.strip()
                      for name in lab}
        assert loop_after == {name: "active" for name in lab}, loop_after
        flat = " ".join(out.split())
        assert "1 job(s) will end" in flat and job_id in flat, flat[-3000:]
        assert flat.index(job_id) < flat.index("PLAY [Keep what every node runs"), "the job was named after the stop"
        assert versions(lab) == {name: (NEW, NEW) for name in lab}
        assert NEW in api_version(lab)
        assert labkit.alive_ips(lab) == all_alive
        figures[f"{OLD} -> {NEW}"] = downtime(out)

        # A clean rerun after the upgrade changes nothing and restarts nothing.
        units = labkit.invocation_ids(lab)
        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        assert rc == 0, out[-3000:]
        assert all(s["changed"] == 0 for s in stats.values()), stats
        assert labkit.invocation_ids(lab) == units

        # The new version does not start on worker1 (its `ray` fails once the stop begins): every node goes back.
        broken = f"/opt/ray/venv-{OLD}/bin/ray"
        sabotaged = []

        def break_worker1(event):
            if (not sabotaged and event.get("event") == "playbook_on_play_start"
                    and (event.get("event_data") or {}).get("play") == "Keep what every node runs, then stop every node at once"):
                labkit.sh(WORKER1, f"mv {broken} {broken}.real && printf '#!/bin/sh\\nexit 3\\n' > {broken} "
                                   f"&& chmod 0755 {broken}")
                sabotaged.append(True)

        rc, out, stats = upgrade(lab, OLD, "-e", "ray_wait_for_nodes_timeout=45", on_event=break_worker1)
        assert sabotaged, out[-3000:]
        flat = " ".join(out.split())
        assert rc != 0, flat[-3000:]
        assert "Traceback" not in out
        assert f"Ray {OLD} did not come up, so every node was rolled back to Ray {NEW}" in flat, flat[-3000:]
        assert lab[WORKER1]["lab_fabric_ip"] in flat.split(f"Ray {OLD} did not come up")[1], flat[-3000:]
        # Back as before: every node runs the old files and venv, alive, with nothing owed.
        assert versions(lab) == {name: (NEW, NEW) for name in lab}
        assert labkit.alive_ips(lab) == all_alive
        for name in lab:
            assert labkit.sh(name, "test -e /etc/ray/.restart-pending", check=False).returncode == 1, name
        units = labkit.invocation_ids(lab)
        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        assert rc == 0, out[-3000:]
        assert all(s["changed"] == 0 for s in stats.values()), stats
        assert labkit.invocation_ids(lab) == units
        print("\nupgrade.yml downtime (stop to every node alive): "
              + ", ".join(f"{how} {took:.1f} s" for how, took in figures.items())
              + f"; a start failure of {OLD} on {WORKER1} rolled every node back to {NEW}")
    finally:
        labkit.sh(WORKER1, f"test ! -e /opt/ray/venv-{OLD}/bin/ray.real || mv /opt/ray/venv-{OLD}/bin/ray.real "
                           f"/opt/ray/venv-{OLD}/bin/ray", check=False)
        if versions(lab) != {name: (NEW, NEW) for name in lab}:
            rc, out, _ = upgrade(lab, NEW)
            assert rc == 0, out[-3000:]
