"""Ray on the lab: fabric binding, systemd, token auth, idempotence, recovery.

Driven through raymetal.runner (ansible-runner). The `cluster` fixture deploys
site.yml once; tests that redeploy leave the cluster as they found it.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.lab import labkit
from tests.lab.labkit import counting_deploy

HEAD = labkit.HEAD
TOKEN_ENV = "set -a; . /etc/ray/ray.env; set +a"


def head_ip(lab):
    return lab[HEAD]["lab_fabric_ip"]


def api(lab, path, *, token=True, on=HEAD):
    """GET the head's dashboard API from a lab node over the fabric; (status, body)."""
    auth = '-H "Authorization: Bearer $(cat /etc/ray/auth_token)"' if token else ""
    out = labkit.sh(
        on,
        f"curl -s -m 10 {auth} -o /tmp/api.out -w '%{{http_code}}' http://{head_ip(lab)}:8265{path}; echo; cat /tmp/api.out",
    ).stdout
    code, _, body = out.partition("\n")
    return int(code), body


def test_the_cluster_scenario_s_verify_playbook_passes_on_the_session_deploy(cluster, lab):
    """extensions/molecule/cluster's steps on this lab's first deploy (a fresh converge, over SSH, with the
    wheelhouse mirror), on Debian 12: the converge (the cluster fixture), the full-path idempotence
    (test_rerun_changes_nothing_and_keeps_nodes_and_jobs), and here the scenario's check (every task in check mode,
    not the fast path, on the converged nodes: nothing to change) and its verify playbook. Lab 2 runs the same on
    Debian 13 (tests/lab/test_cluster_scenario.py)."""
    labkit.cluster_scenario_check_and_verify(lab)


def test_every_node_is_alive_on_its_ib0_address(cluster, lab):
    assert cluster["nodes_alive"] == len(lab) == 3
    assert cluster["healthy"] is True
    assert cluster["ray_version"] == "2.60.0"
    ips = sorted(n["ip"] for n in cluster["nodes"] if n["state"] == "ALIVE")
    assert ips == sorted(h["lab_fabric_ip"] for h in lab.values())
    for name, hvars in lab.items():
        ib0 = labkit.sh(name, "ip -4 -o addr show ib0 | awk '{print $4}'").stdout.strip()
        assert ib0.split("/")[0] == hvars["lab_fabric_ip"]
    heads = [n for n in cluster["nodes"] if n["is_head"]]
    assert [n["ip"] for n in heads] == [head_ip(lab)]


def test_units_run_as_ray_with_the_limits_rdma_needs(cluster, lab):
    for name in lab:
        unit = labkit.unit_of(lab, name)
        props = dict(
            line.split("=", 1)
            for line in labkit.sh(
                name,
                f"systemctl show {unit} -p ActiveState -p User -p LimitMEMLOCK -p LimitNOFILE -p TasksMax "
                "-p KillMode -p Restart -p NoNewPrivileges -p ProtectSystem -p PrivateDevices",
            ).stdout.split("\n")
            if "=" in line
        )
        assert props["ActiveState"] == "active", (name, props)
        assert props["User"] == "ray"
        assert props["LimitMEMLOCK"] == "infinity"
        assert props["LimitNOFILE"] == "1048576"
        assert props["TasksMax"] == "infinity"
        assert props["KillMode"] == "mixed"
        assert props["Restart"] == "always"
        assert props["NoNewPrivileges"] == "yes"
        assert props["ProtectSystem"] == "strict"
        assert props["PrivateDevices"] == "no"
        # Ray really runs as ray, and with the fabric settings in its environment.
        owner = labkit.sh(name, "ps -o user= -C raylet | sort -u").stdout.split()
        assert owner == ["ray"], (name, owner)
        env = labkit.sh(name, "cat /etc/ray/ray.env").stdout
        assert "NCCL_SOCKET_IFNAME" not in env, (name, env)  # the nccl role owns it, in /etc/nccl.conf
        for line in ("RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH=/etc/ray/auth_token",
                     "GLOO_SOCKET_IFNAME=ib0", "RAY_USAGE_STATS_ENABLED=0"):
            assert line in env.splitlines(), (name, line, env)
        stat = labkit.sh(name, "stat -c '%a %U' /etc/ray/auth_token").stdout.split()
        assert stat == ["600", "ray"], name


def test_units_are_hardened_to_5_or_lower_in_systemd_analyze_security(cluster, lab):
    """The running units' exposure (systemd's own score, 0 safest .. 10), with Ray alive under it."""
    scores = {}
    for name in lab:
        out = labkit.sh(name, f"systemd-analyze security --no-pager {labkit.unit_of(lab, name)}.service").stdout
        scores[name] = float(out.rsplit("Overall exposure level for", 1)[1].split(":", 1)[1].split()[0])
        caps = labkit.sh(name, "grep -h '^CapEff' /proc/$(pgrep -x raylet)/status").stdout.split()[1]
        assert int(caps, 16) == 0, (name, caps)  # no capability at all
    print(f"\nsystemd-analyze security: {scores}")
    assert all(score <= 5.0 for score in scores.values()), scores


def test_resource_isolation_is_off_on_the_cgroup_v1_lab_with_the_reason_reported(cluster, lab):
    """The lab's host runs cgroup v1, where Ray cannot isolate its processes: under the default (auto) the deploy
    reports it off with the reason, per host (the summary and the Python API), and the unit keeps
    ProtectControlGroups and passes no isolation flag. The cgroup v2 side: tests/unit/plugins/filter/test_ray_isolation.py."""
    assert set(cluster["resource_isolation"]) == set(lab), cluster["resource_isolation"]
    for name, plan in cluster["resource_isolation"].items():
        assert plan["enabled"] is False and plan["problem"] == "", (name, plan)
        assert plan["reason"].startswith("off: cgroup v1"), (name, plan)
        unit = labkit.sh(name, f"systemctl cat {labkit.unit_of(lab, name)}").stdout
        assert "ProtectControlGroups=yes" in unit and "Delegate=" not in unit
        assert "--enable-resource-isolation" not in unit


def test_one_token_on_every_node_never_in_the_unit(cluster, lab):
    tokens = {labkit.sh(name, "cat /etc/ray/auth_token").stdout.strip() for name in lab}
    assert len(tokens) == 1 and len(tokens.pop()) == 64
    for name in lab:
        shown = labkit.sh(name, f"systemctl show {labkit.unit_of(lab, name)} -p Environment -p ExecStart").stdout
        assert labkit.sh(name, "cat /etc/ray/auth_token").stdout.strip() not in shown


def test_dashboard_answers_401_without_the_token_and_200_with_it(cluster, lab):
    code, _ = api(lab, "/api/version", token=False, on=labkit.WORKER1)
    assert code == 401
    code, body = api(lab, "/api/version", token=True, on=labkit.WORKER1)
    assert code == 200 and json.loads(body)["ray_version"] == "2.60.0"


@pytest.mark.parametrize("auth", ["no token", "wrong token"])
def test_a_node_without_the_right_token_is_refused(cluster, lab, auth):
    env = "RAY_AUTH_MODE=disabled" if auth == "no token" else "RAY_AUTH_MODE=token RAY_AUTH_TOKEN=" + "0" * 64
    script = (
        f"cd /tmp && env -i PATH=/usr/bin:/bin {env} timeout 120 /opt/ray/venv/bin/ray start "
        f"--address={head_ip(lab)}:6379 --node-ip-address={lab[labkit.WORKER2]['lab_fabric_ip']} "
        "--temp-dir=/tmp/ray-intruder --node-manager-port=7380 --object-manager-port=7381 "
        "--runtime-env-agent-port=7382 --dashboard-agent-grpc-port=7383 --dashboard-agent-listen-port=7384 "
        "--metrics-export-port=7385 --min-worker-port=20002 --max-worker-port=20100 --disable-usage-stats"
    )
    before = labkit.alive_nodes(lab)
    assert len(before) == len(lab), before
    try:
        proc = labkit.sh(labkit.WORKER2, script, check=False, timeout=180, user="ray")
    finally:
        # If it had joined, leave nothing behind (by temp dir, never `ray stop`).
        labkit.sh(labkit.WORKER2, "pkill -9 -f /tmp/ray-intruder; rm -rf /tmp/ray-intruder", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert any(s in out for s in ("InvalidAuthToken", "AuthenticationError", "Unauthenticated", "UNAUTHENTICATED")), out
    assert labkit.alive_nodes(lab) == before


def test_rerun_changes_nothing_and_keeps_nodes_and_jobs(cluster, lab, full_rerun):
    # Every task, as without the fast path (the session's shared full rerun, conftest.full_rerun, made with a job
    # running): the roles themselves change nothing.
    run = full_rerun
    assert len(run.before.nodes) == len(lab) and run.before.job == "RUNNING", run.before
    assert run.rc == 0, run.output[-3000:]
    assert run.changed == [], run.changed
    assert f"{labkit.WORKER1}: Write Ray's directories, token, environment, unit, labels, cluster description, helpers " \
           "and session pruner" in run.ran
    assert run.after.nodes == run.before.nodes
    assert run.after.units == run.before.units
    assert run.after.job == "RUNNING"
    assert run.facts["nodes_alive"] == 3, run.facts
    # As users rerun it: the fast path, one probe per node and the summary on the head, with a job running.
    with labkit.sleeper_job(lab) as job_id:
        counting_deploy(labkit.LAB_INVENTORY)  # records, or finds the record fresh
        units_before = labkit.invocation_ids(lab)
        ran = []
        facts, changed = counting_deploy(labkit.LAB_INVENTORY, None, ran)
        assert changed == [], changed
        assert sorted(t for t in ran if t.startswith((labkit.WORKER1 + ":", labkit.WORKER2 + ":"))) == [
            f"{labkit.WORKER1}: Compare the node with the last deploy's record",
            f"{labkit.WORKER2}: Compare the node with the last deploy's record"], ran
        assert labkit.invocation_ids(lab) == units_before
        assert labkit.job_status(lab, job_id) == "RUNNING"
        assert facts["nodes_alive"] == 3 and facts["missing"] == [], facts


def test_the_fast_path_sees_drift_and_the_full_deploy_repairs_it(cluster, lab):
    """A file edited by hand and a unit stopped on one worker send that worker (and the head) the full way, which
    puts both back; the other worker keeps the fast path (its probe and the read-only checks, no role's change)."""
    counting_deploy(labkit.LAB_INVENTORY)  # records, or finds the record fresh
    before = labkit.invocation_ids(lab)
    labkit.sh(labkit.WORKER1, "echo '# edited by hand' >> /etc/ray/ray.env; systemctl stop ray-prune-sessions.timer")
    ran, changed = [], []

    def on_event(event):
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed") and data.get("host"):
            ran.append(f"{data['host']}: {data.get('task')}")
            if (data.get("res") or {}).get("changed"):
                changed.append(f"{data['host']}: {data.get('task')}")

    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, on_event=on_event)
    assert rc == 0, out[-3000:]
    assert "1 of 3 host(s) differ from what the last deploy applied" in out, out[-3000:]
    # The fast path's line for worker1: its differences, in the module's order.
    line = next((x.strip() for x in out.splitlines() if "/etc/ray/ray.env: content" in x), "")
    assert line.startswith(f"{labkit.WORKER1}: "), out[:6000]
    assert "unit ray-prune-sessions.timer: inactive/enabled, recorded active/enabled" in line, out[-3000:]
    assert f"The full path runs on 2 host(s), the head and those that differ: {HEAD}, {labkit.WORKER1}. The other 1 " \
           f"keep what the last deploy applied (the fast path): {labkit.WORKER2}." in " ".join(out.split()), out[-3000:]
    assert f"{labkit.WORKER2}: unchanged since the last deploy (fast path)" in out, out[-3000:]
    assert "edited by hand" not in labkit.sh(labkit.WORKER1, "cat /etc/ray/ray.env").stdout
    assert labkit.sh(labkit.WORKER1, "systemctl is-active ray-prune-sessions.timer", check=False).stdout.strip() == "active"
    assert changed and all(c.startswith(labkit.WORKER1 + ":") for c in changed), changed
    # The full path ran on worker1 and the head, not on worker2 (which ran only the checks that read).
    assert f"{labkit.WORKER1}: Write Ray's directories, token, environment, unit, labels, cluster description, helpers " \
           "and session pruner" in ran, ran
    assert f"{HEAD}: Write Ray's directories, token, environment, unit, labels, cluster description, helpers " \
           "and session pruner" in ran, ran
    assert not any(t.startswith(labkit.WORKER2 + ":") and "Write Ray's directories" in t for t in ran), ran
    assert f"{labkit.WORKER2}: Compare the node with the last deploy's record" in ran
    after = labkit.invocation_ids(lab)
    assert after[HEAD] == before[HEAD] and after[labkit.WORKER2] == before[labkit.WORKER2], (before, after)
    assert after[labkit.WORKER1] != before[labkit.WORKER1]
    assert len(labkit.alive_nodes(lab)) == 3
    # Repaired and recorded: the next deploy is the fast path again.
    ran = []
    facts, changed = counting_deploy(labkit.LAB_INVENTORY, None, ran)
    assert changed == [], changed
    assert f"{labkit.WORKER1}: Compare the node with the last deploy's record" in ran
    assert not any("Write Ray's directories" in t for t in ran), ran
    assert facts["nodes_alive"] == 3
    assert sorted(facts["unchanged"]) == sorted(lab), facts["unchanged"]


def test_a_worker_only_change_restarts_only_that_worker(cluster, lab, tmp_path):
    """A setting in one worker's host_vars file: that worker (and the head) take the full path, the other worker
    the fast path (the fast path per host); only that worker's Ray restarts. Undone the same way."""
    counting_deploy(labkit.LAB_INVENTORY)  # records, or finds the record fresh
    inv = labkit.inventory_copy(tmp_path, {labkit.WORKER1: {"ray_labels": {"raymetal-test": "relabel"}}})
    before = labkit.invocation_ids(lab)
    write = "Write Ray's directories, token, environment, unit, labels, cluster description, helpers and session pruner"
    # Two stops by itself in the last minute in the restart backoff's record: the deploy's restart is a deliberate
    # one (systemd runs ExecStop while Ray still runs), which clears them and waits for nothing. Were it counted as
    # Ray's own third stop, the record would keep them and the start would wait about 20 s, saying so.
    now = time.time()
    labkit.set_restart_record(labkit.WORKER1, {"stops": [now - 60, now - 30], "stopping": False})
    since = labkit.sh(labkit.WORKER1, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    try:
        ran = []
        facts, changed = counting_deploy(inv, None, ran)
        after = labkit.invocation_ids(lab)
        assert labkit.restart_record(labkit.WORKER1) == {"stops": [], "stopping": False}
        journal = labkit.sh(labkit.WORKER1, f"journalctl -u ray-worker --no-pager --since '{since}'").stdout
        assert "starting it again in" not in journal, journal[-3000:]
        assert after[HEAD] == before[HEAD]
        assert after[labkit.WORKER2] == before[labkit.WORKER2]
        assert after[labkit.WORKER1] != before[labkit.WORKER1]
        assert changed and all(c.startswith(labkit.WORKER1 + ":") for c in changed), changed
        worker1 = [n for n in facts["nodes"] if n["ip"] == lab[labkit.WORKER1]["lab_fabric_ip"] and n["state"] == "ALIVE"]
        assert worker1 and worker1[0]["labels"].get("raymetal-test") == "relabel", worker1
        assert f"{labkit.WORKER1}: {write}" in ran and f"{HEAD}: {write}" in ran, ran
        assert f"{labkit.WORKER2}: {write}" not in ran, ran
        assert facts["unchanged"] == [labkit.WORKER2], facts["unchanged"]
    finally:
        ran = []
        counting_deploy(labkit.LAB_INVENTORY, None, ran)
    assert f"{labkit.WORKER2}: {write}" not in ran and f"{labkit.WORKER1}: {write}" in ran, ran
    assert labkit.invocation_ids(lab, [HEAD, labkit.WORKER2]) == {h: before[h] for h in (HEAD, labkit.WORKER2)}


def test_a_killed_raylet_comes_back_by_itself(cluster, lab):
    name = labkit.WORKER2
    ip = lab[name]["lab_fabric_ip"]
    old_id = labkit.alive_nodes(lab)[ip]
    labkit.sh(name, "pkill -9 -x raylet")
    labkit.wait_until(lambda: labkit.alive_nodes(lab).get(ip) not in (None, old_id), 180, interval=3,
                      what=f"{name} back as a new alive node")
    assert len(labkit.alive_nodes(lab)) == 3
    restarts = labkit.sh(name, "systemctl show -p NRestarts --value ray-worker").stdout.strip()
    assert int(restarts) >= 1


def test_check_mode_on_the_running_cluster_plans_nothing(cluster, lab):
    before = labkit.invocation_ids(lab)
    rc, out, recap = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "--check", "--diff")
    assert rc == 0, out
    assert set(lab) <= set(recap)
    assert all(c["changed"] == 0 and c["failed"] == 0 for c in recap.values()), recap
    assert labkit.invocation_ids(lab) == before


def test_the_session_pruner_removes_old_sessions_never_the_live_one(cluster, lab):
    """ray-prune-sessions.timer is active; its service, run now, removes a month-old session, keeps the live one."""
    name = labkit.WORKER1
    temp = "/var/lib/ray/tmp"
    old = f"{temp}/session_2020-01-01_00-00-00_000000_1"
    labkit.sh(name, f"install -d -o ray -g ray {old} {old}/logs && echo x > {old}/logs/raylet.out"
                    f" && chown ray: {old}/logs/raylet.out && touch -d '30 days ago' {old}")
    live = labkit.sh(name, f"readlink -e {temp}/session_latest").stdout.strip()
    raylet = labkit.sh(name, "pgrep -x raylet").stdout.strip()
    timer = labkit.sh(name, "systemctl is-enabled ray-prune-sessions.timer; systemctl is-active ray-prune-sessions.timer",
                      check=False).stdout.split()
    assert timer == ["enabled", "active"], timer

    labkit.sh(name, "systemctl start ray-prune-sessions.service")

    assert labkit.sh(name, f"test -e {old}", check=False).returncode == 1, "the old session is still there"
    assert live and labkit.sh(name, f"test -d {live}/logs", check=False).returncode == 0, "the live session is gone"
    assert labkit.sh(name, "pgrep -x raylet").stdout.strip() == raylet
    journal = labkit.sh(name, "journalctl -u ray-prune-sessions.service -o cat --no-pager | tail -5").stdout
    assert f"removed {old}" in journal, journal


LABELS_JOB = r'''
import json, sys, ray
from ray.util.placement_group import placement_group, placement_group_table
ray.init(address=sys.argv[1], logging_level="ERROR")

@ray.remote(num_cpus=0)
def where():
    return ray.util.get_node_ip_address()

on_rack2 = ray.get([where.options(label_selector={"raymetal.io/rack": "rack-2"}).remote() for _ in range(4)])
# Two bundles of 2 CPUs: no lab node has 4, and rack-2 has one node, so packing by rack puts the
# bundles on the two nodes of rack-1.
pg = placement_group([{"CPU": 2}, {"CPU": 2}], topology_strategy={"raymetal.io/rack": "STRICT_PACK"})
ray.get(pg.ready(), timeout=120)
by_id = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
bundles = [by_id[node] for node in placement_group_table(pg)["bundles_to_node_id"].values()]
print("LABELS " + json.dumps({"rack2": on_rack2, "bundles": bundles}))
'''


def test_rack_labels_steer_tasks_and_pack_placement_groups_by_topology(cluster, lab):
    """Every node carries its derived labels and its rack (lab.sh puts head+worker1 in rack-1, worker2 in rack-2)."""
    racks = {"rack-1": {head_ip(lab), lab[labkit.WORKER1]["lab_fabric_ip"]}, "rack-2": {lab[labkit.WORKER2]["lab_fabric_ip"]}}
    for node in cluster["nodes"]:
        if node["state"] == "ALIVE":
            assert node["labels"].get("raymetal.io/fabric") == "ethernet", node  # the lab's ib0 has no HCA
            assert node["ip"] in racks[node["labels"]["raymetal.io/rack"]], node
    labkit.sh(HEAD, f"cat > /tmp/labels_job.py <<'EOF'\n{LABELS_JOB}\nEOF")
    out = labkit.sh(HEAD, f"{TOKEN_ENV}; cd /tmp && /opt/ray/venv/bin/python /tmp/labels_job.py {head_ip(lab)}:6379",
                    timeout=240).stdout
    seen = json.loads(out.split("LABELS ", 1)[1])
    assert set(seen["rack2"]) == racks["rack-2"], seen
    assert set(seen["bundles"]) == racks["rack-1"], seen  # both nodes of rack-1, nothing elsewhere
