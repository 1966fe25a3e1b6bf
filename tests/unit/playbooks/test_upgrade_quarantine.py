"""playbooks/upgrade.yml and a worker the health loop holds quarantined.

The upgrade stopped every node and started every node again, so a quarantined worker (a hardware one included) came
back into the cluster with the new version; since the loop drains and stops a quarantined worker whose Ray runs, the
upgrade's wait for every node could then lose that worker and roll the whole cluster back. Now the worker switches to
the new version but stays stopped (its loop, or readmit.yml, starts it), the wait does not count it, and a rollback
puts the old version back there without starting it. Read from the playbook and the ray role's rollback, their
conditions evaluated for each kind of node.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[3]
UPGRADE = yaml.safe_load((ROOT / "playbooks" / "upgrade.yml").read_text())
GROUPS = {"ray_head": ["head"], "ray_worker": ["w1", "w2"]}
RECORD = {"state": "quarantined", "class": "hardware", "check": "gpu_xid"}


def holds(expression, host, quarantine):
    env = jinja2.Environment()
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("true", "yes", "1", "on")
    source = expression.strip()
    if source.startswith("{{"):
        return env.from_string(source).render(inventory_hostname=host, groups=GROUPS,
                                              health_quarantine=quarantine) == "True"
    return bool(env.compile_expression(source)(inventory_hostname=host, groups=GROUPS, health_quarantine=quarantine))


def play(name):
    return next(p for p in UPGRADE if p.get("name") == name)


def test_a_quarantined_worker_switches_to_the_new_version_but_is_not_started():
    tasks = play("Switch every node to the new version and start it")["tasks"]
    names = [t["name"] for t in tasks]
    state = names.index("Read whether the health loop holds this node quarantined")
    assert tasks[state]["ansible.builtin.import_role"] == {"name": "health", "tasks_from": "state.yml"}
    block = tasks[names.index("Switch and start, and note a failure for the rollback")]["block"]
    assert state < names.index("Switch and start, and note a failure for the rollback")
    switch, start = block
    assert "when" not in switch, "every node switches, a quarantined one too"
    assert start["ansible.builtin.import_role"]["tasks_from"] == "start.yml"
    assert holds(start["when"], "w1", {}) and holds(start["when"], "head", {})
    assert not holds(start["when"], "w1", RECORD)
    # The loop never stops the head: a record there does not keep it down.
    assert holds(start["when"], "head", RECORD)


def test_the_wait_does_not_count_a_quarantined_worker():
    wiring = yaml.safe_load((ROOT / "roles" / "wiring" / "vars" / "main.yml").read_text())
    assert "raymetal.cluster.health_quarantined(hostvars)" in wiring["ray_summary_left_out"]
    wait = play("Wait until every node runs the new version")
    assert {"ansible.builtin.import_role": {"name": "wiring"}}.items() <= wait["tasks"][0].items()


def test_a_rollback_puts_the_old_version_back_on_a_quarantined_worker_without_starting_it():
    task = play("Roll back every node to the version it ran before, if the new one did not come up")["tasks"][0]
    assert task["ansible.builtin.import_role"]["tasks_from"] == "rollback.yml"
    start = task["vars"]["ray_rollback_start"]
    assert holds(start, "w1", {}) and holds(start, "head", RECORD) and not holds(start, "w1", RECORD)
    rollback = yaml.safe_load((ROOT / "roles" / "ray" / "tasks" / "rollback.yml").read_text())
    started = [t for t in rollback if t.get("ansible.builtin.systemd_service", {}).get("state") == "started"]
    assert len(started) == 1 and started[0]["when"] == "ray_rollback_start | bool"
    defaults = yaml.safe_load((ROOT / "roles" / "ray" / "defaults" / "main.yml").read_text())
    assert defaults["ray_rollback_start"] is True


def test_the_health_loop_is_paused_before_the_stop_and_runs_again_after_the_wait_or_the_rollback():
    # A round between the stop and the switch could re-admit a transient quarantine and start the old version there.
    stop = play("Keep what every node runs, then stop every node at once")["tasks"]
    roles = [t.get("ansible.builtin.import_role", {}) for t in stop]
    pause = roles.index({"name": "health", "tasks_from": "pause.yml"})
    first_stop = next(i for i, r in enumerate(roles) if r.get("tasks_from") == "stop.yml")
    assert pause < first_stop and "when" not in stop[pause]
    names = [p.get("name") for p in UPGRADE]
    resume = names.index("Run the health loop again where the upgrade paused it")
    assert names.index("Roll back every node to the version it ran before, if the new one did not come up") < resume
    assert resume < names.index("Report the upgrade, or the rollback")
    assert UPGRADE[resume]["hosts"] == "ray_cluster"
    assert UPGRADE[resume]["tasks"][0]["ansible.builtin.import_role"] == {"name": "health", "tasks_from": "resume.yml"}
    tasks = ROOT / "roles" / "health" / "tasks"
    paused = yaml.safe_load((tasks / "pause.yml").read_text())
    assert paused[0]["ansible.builtin.systemd_service"]["state"] == "stopped"
    assert paused[-1]["ansible.builtin.set_fact"]["health_paused"] == "{{ __health_pause is changed }}"
    resumed = yaml.safe_load((tasks / "resume.yml").read_text())
    assert resumed[0]["ansible.builtin.systemd_service"]["state"] == "started"
    # Only where this run stopped it: a loop an operator stopped by hand stays stopped.
    assert resumed[0]["when"] == "health_paused | default(false) | bool"
