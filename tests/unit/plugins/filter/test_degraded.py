"""The degraded-mode deploy's decisions (plugins/filter/degraded.py): which unreachable workers a deploy leaves out
under raymetal_max_unreachable, and when it stops before any change instead."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.raymetal.cluster.plugins.filter import degraded as d
from raymetal import runner

WORKERS = ["w1", "w2", "w3", "w4"]
SSH = ('Task failed: Data could not be sent to remote host "10.0.0.3". Make sure this host can be reached over ssh: '
       "ssh: connect to host 10.0.0.3 port 22: No route to host")


def test_every_host_reached_leaves_nothing_out():
    for budget in (0, 3, "0", "0%", "10%", "100%"):
        assert d.unreachable_plan({}, WORKERS, budget) == {"left_out": {}, "refused": ""}, budget


def test_a_bad_budget_is_refused_even_when_every_host_is_reached():
    """It was only refused on the day a host was unreachable and the budget was needed."""
    for budget in ("bogus", -1, "150%", "x%", True, "1.5"):
        plan = d.unreachable_plan({}, WORKERS, budget)
        assert plan["left_out"] == {}
        assert plan["refused"].startswith("raymetal_max_unreachable=%r " % (budget,)), plan
        assert "Fix: set raymetal_max_unreachable to a whole number of workers" in plan["refused"]


@pytest.mark.parametrize("budget", [0, 3, "0", "3", "0%", "10%", "100%", " 5 % "])
def test_a_good_budget_is_no_problem(budget):
    assert d.unreachable_budget_problem(budget) == ""


@pytest.mark.parametrize("budget, why", [("bogus", "'bogus' is not a count or a percentage"),
                                         (-1, "-1 is negative"),
                                         ("-1", "'-1' is not a count or a percentage"),
                                         ("150%", "'150%' is not a count or a percentage"),
                                         ("x%", "'x%' is not a count or a percentage"),
                                         ("1.5", "'1.5' is not a count or a percentage"),
                                         (1.0, "1.0 is not a count or a percentage"),
                                         (True, "True is not a count or a percentage"),
                                         (None, "None is not a count or a percentage"),
                                         ("", "'' is not a count or a percentage"),
                                         ("²", "'²' is not a count or a percentage")])
def test_a_bad_budget_is_a_problem_naming_the_variable_the_value_and_the_fix(budget, why):
    problem = d.unreachable_budget_problem(budget)
    assert problem.startswith("raymetal_max_unreachable=" + why + ". "), problem
    assert problem.endswith("Fix: set raymetal_max_unreachable to a whole number of workers (0 = every host must be "
                            "reachable) or to a percentage of the workers such as '5%'."), problem
    # The same message unreachable_plan stops with: one reading of the budget, not two.
    assert d.unreachable_plan({}, WORKERS, budget)["refused"] == problem


def test_the_default_budget_refuses_one_unreachable_worker_and_names_it():
    plan = d.unreachable_plan({"w3": SSH}, WORKERS, 0)
    assert plan["left_out"] == {}
    assert "w3 (ssh: connect to host 10.0.0.3 port 22: No route to host)" in plan["refused"]
    assert plan["refused"].startswith("1 host(s) cannot be reached, so nothing was changed anywhere: w3 (")
    assert "The budget (raymetal_max_unreachable=0) allows 0 of the 4 worker(s)" in plan["refused"]


def test_within_the_budget_the_workers_are_left_out_with_ssh_s_reason():
    plan = d.unreachable_plan({"w3": SSH}, WORKERS, 1)
    assert plan == {"left_out": {"w3": "unreachable (ssh: connect to host 10.0.0.3 port 22: No route to host)"},
                    "refused": ""}


@pytest.mark.parametrize("budget, allowed", [(1, 1), ("1", 1), ("25%", 1), ("49%", 1), ("50%", 2), ("100%", 4), ("0%", 0)])
def test_a_budget_is_a_count_or_a_share_of_the_workers_rounded_down(budget, allowed):
    assert d.unreachable_budget(budget, WORKERS) == (allowed, "")


# '²' is a digit to str.isdigit() but not to int(): it was a ValueError (a traceback), not a message.
# Other scripts' digits ('３', '٣') are refused too: the inventory spells a budget in ASCII.
@pytest.mark.parametrize("budget", [-1, "-1", "x", "150%", "1.5", True, None, "²", "3²", "３", "٣", "１０%", "", "%"])
def test_a_bad_budget_refuses_with_the_variable_and_the_fix(budget):
    plan = d.unreachable_plan({"w3": SSH}, WORKERS, budget)
    assert plan["left_out"] == {} and plan["refused"].startswith("raymetal_max_unreachable=")
    assert "Fix: set raymetal_max_unreachable" in plan["refused"]


def test_over_the_budget_nothing_is_left_out():
    plan = d.unreachable_plan({"w3": SSH, "w4": "timeout"}, WORKERS, 1)
    assert plan["left_out"] == {}
    assert plan["refused"].startswith("2 host(s) cannot be reached") and "allows 1 of the 4 worker(s)" in plan["refused"]


def test_the_messages_name_each_host_s_address():
    plan = d.unreachable_plan({"w3": SSH}, WORKERS, 1, {}, True, {"w3": "10.0.0.3"})
    assert plan["left_out"] == {"w3": "unreachable (ansible_host=10.0.0.3: ssh: connect to host 10.0.0.3 port 22: No route to host)"}
    plan = d.unreachable_plan({"w3": SSH}, WORKERS, 0, {}, True, {"w3": "10.0.0.3"})
    assert plan["refused"].startswith("1 host(s) cannot be reached, so nothing was changed anywhere: w3 (ansible_host=10.0.0.3: ssh:")


@pytest.mark.parametrize("host, what", [("head", "the head"), ("w2", "the Redis host of the GCS store"),
                                        ("w1", "the wheelhouse mirror host")])
def test_a_host_that_serves_the_cluster_refuses_whatever_the_budget(host, what):
    critical = {"head": "the head", "w2": "the Redis host of the GCS store", "w1": "the wheelhouse mirror host"}
    plan = d.unreachable_plan({host: SSH}, WORKERS, "100%", critical)
    assert plan["left_out"] == {} and "%s is %s" % (host, what) in plan["refused"]


def test_a_host_that_is_not_a_worker_is_never_left_out():
    plan = d.unreachable_plan({"stray": SSH}, WORKERS, 5)
    assert plan["left_out"] == {} and "stray is not a worker" in plan["refused"]


def test_a_playbook_that_needs_every_host_refuses_even_within_the_budget():
    plan = d.unreachable_plan({"w3": SSH}, WORKERS, 2, {}, False)
    assert plan["left_out"] == {} and "This playbook needs every host" in plan["refused"]


def test_the_play_pattern_excludes_the_left_out_hosts():
    assert d.exclude_pattern("ray_cluster", []) == "ray_cluster"
    assert d.exclude_pattern("ray_cluster", ["w7", "w3"]) == "ray_cluster:!w3:!w7"


def test_the_head_records_every_known_member_with_its_ports():
    hostvars = {"head": {"ray_node_ip": "10.0.0.1", "ray_ports": [{"name": "gcs", "port": 6379}]},
                "w1": {"ray_node_ip": "10.0.0.2/24"}, "w2": {}}
    assert d.cluster_members(["head", "w1", "w2", "gone"], hostvars) == {
        "head": {"address": "10.0.0.1", "ray_ports": [{"name": "gcs", "port": 6379}]},
        "w1": {"address": "10.0.0.2", "ray_ports": []}}


def _error(rc, left_out, failures):
    return runner.RaymetalError("site.yml failed", failures=failures, rc=rc,
                                stats={"ray_cluster": {"left_out": left_out, "nodes": []}})


def test_the_api_returns_a_deploy_that_left_out_unreachable_workers():
    err = _error(4, {"w3": "unreachable (...)"}, [{"host": "w3", "unreachable": True}])
    assert runner.degraded_deploy(err)


@pytest.mark.parametrize("rc, left_out, failures", [
    (2, {"w3": "x"}, [{"host": "w3", "unreachable": True}]),            # a task failed
    (4, {}, [{"host": "w3", "unreachable": True}]),                     # nobody was left out on purpose
    (4, {"w3": "x"}, [{"host": "w4", "unreachable": True}]),            # another host was lost
    (4, {"w3": "x"}, [{"host": "w3", "unreachable": True}, {"host": "head", "unreachable": False}]),
    (4, {"w3": "x"}, []),
])
def test_the_api_raises_for_any_other_failure(rc, left_out, failures):
    assert not runner.degraded_deploy(_error(rc, left_out, failures))


# validate.yml for real on this machine (connection local): the lab's bad-budget inventory (every host fine, the
# budget set in ray_cluster's group variables, which the inventory's localhost play does not see) stops in the
# budget's own check, once, before any host is contacted; so does it with the head unreachable. A good budget
# passes validation. What this cannot show: that no file changed on a node (tests/lab/test_validate.py).
ROOT = Path(__file__).resolve().parents[4]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
BUDGET_TASK = "TASK [Check that raymetal_max_unreachable is a count or a percentage of the workers]"


def validate(tmp_path, *extra, host_vars=None):
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "inventories" / "bad_budget.yml", inv / "hosts.yml")
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump({
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
        "raymetal_validate_require_systemd": False}))
    for host, hvars in (host_vars or {}).items():
        (inv / "host_vars" / ("%s.yml" % host)).write_text(yaml.safe_dump(hvars))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inv), "playbooks/validate.yml", *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("host_vars", [{}, {"raymetal-head": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1",
                                                               "ansible_port": 1}}], ids=["all_reachable", "head_unreachable"])
def test_validation_stops_on_a_bad_budget_before_it_contacts_any_host(tmp_path, host_vars):
    rc, out = validate(tmp_path, host_vars=host_vars)
    assert rc != 0, out
    flat = " ".join(out.split())
    assert "raymetal_max_unreachable=''lots'' is not a count or a percentage. Fix: set raymetal_max_unreachable" in flat, out
    assert out.count("fatal:") == 1 and flat.index("fatal:") > flat.index(BUDGET_TASK), out
    assert "Gather the facts" not in out and "UNREACHABLE" not in out, out
    assert "Traceback" not in out, out
    assert not re.search(r"changed=[1-9]", out), out


def test_validation_passes_a_good_budget(tmp_path):
    rc, out = validate(tmp_path, "-e", "raymetal_max_unreachable=10%")
    assert rc == 0, out
    assert BUDGET_TASK in out and "Gather the facts" in out, out


# The fast path per host (raymetal.cluster.fast_path_plan): which hosts the changing plays run on.
HOSTS = ["head", "w1", "w2", "w3"]
ADDRESSES = {"head": "10.0.0.1", "w1": "10.0.0.11", "w2": "10.0.0.12", "w3": "10.0.0.13"}
HOSTVARS = {h: {"ray_node_ip": a} for h, a in ADDRESSES.items()}


def test_only_the_workers_that_differ_and_the_head_take_the_full_path():
    plan = d.fast_path_plan(HOSTS, HOSTVARS, "head", ["w2"], ADDRESSES)
    assert plan == {"converge": ["head", "w2"], "unchanged": ["w1", "w3"], "everywhere": ""}


def test_a_head_that_differs_sends_every_host_the_full_path():
    plan = d.fast_path_plan(HOSTS, HOSTVARS, "head", ["head"], ADDRESSES)
    assert plan["converge"] == HOSTS and plan["unchanged"] == []
    assert plan["everywhere"] == "the head differs from what the last deploy applied"


def test_every_worker_differing_needs_no_reason():
    plan = d.fast_path_plan(HOSTS, HOSTVARS, "head", ["w1", "w2", "w3"], ADDRESSES)
    assert plan == {"converge": HOSTS, "unchanged": [], "everywhere": ""}


def test_an_address_that_moved_or_a_new_node_sends_every_host_the_full_path():
    # w2's fabric address is no longer the recorded one: every firewall must learn the new one.
    moved = dict(HOSTVARS, w2={"ray_node_ip": "10.0.0.99/24"})
    plan = d.fast_path_plan(HOSTS, moved, "head", ["w2"], ADDRESSES)
    assert plan["unchanged"] == [] and plan["converge"] == HOSTS
    assert plan["everywhere"] == "w2's fabric address is 10.0.0.99, recorded 10.0.0.12: every firewall must learn it"
    # w3 has no record (joined the inventory since): every firewall must admit it.
    recorded = {h: a for h, a in ADDRESSES.items() if h != "w3"}
    plan = d.fast_path_plan(HOSTS, HOSTVARS, "head", ["w3"], recorded)
    assert plan["unchanged"] == [] and "w3 has no record of an earlier deploy" in plan["everywhere"]


def test_the_hosts_left_out_are_not_planned():
    # The unreachable workers validation leaves out are not among the hosts the deploy converges.
    plan = d.fast_path_plan(["head", "w1", "w3"], HOSTVARS, "head", ["w1", "w2"], ADDRESSES)
    assert plan == {"converge": ["head", "w1"], "unchanged": ["w3"], "everywhere": ""}


def test_a_first_deploy_needs_no_reason():
    # No record anywhere: every host differs, and the run says nothing beyond the fast path's own message.
    plan = d.fast_path_plan(HOSTS, HOSTVARS, "head", HOSTS, {})
    assert plan == {"converge": HOSTS, "unchanged": [], "everywhere": ""}


def test_health_quarantined_names_each_quarantined_worker_with_its_class_check_and_finding():
    hostvars = {
        "w1": {"health_quarantine": {"state": "quarantined", "class": "hardware", "check": "gpu_xid",
                                     "finding": "Xid 79 on 0000:1b:00.0"}},
        "w2": {"health_quarantine": {}},
        "w3": {},
    }
    assert d.health_quarantined(["w1", "w2", "w3", "gone"], hostvars) == {
        "w1": "quarantined by the health loop (hardware, gpu_xid): Xid 79 on 0000:1b:00.0"}
    assert d.health_quarantined([], hostvars) == {}
    # A record without its details still names the host.
    assert d.health_quarantined(["w1"], {"w1": {"health_quarantine": {"state": "quarantined"}}}) == {
        "w1": "quarantined by the health loop (?, ?): no finding recorded"}


# The full path per role (playbooks/apply.yml): a role is left alone on a host only where the probe found the code,
# the inventory's files and the watched state as recorded and the record holds the role's digest as it is now.
SAME = {"code_same": True, "state_same": True, "applied": {"raymetal_role_inputs": {"firewall": "d1", "health": "h1"}}}


@pytest.mark.parametrize("probe, role, digest, runs", [
    (SAME, "firewall", "d1", False),
    (SAME, "health", "h1", False),
    (SAME, "firewall", "d2", True),
    (SAME, "monitoring", "m1", True),
    (dict(SAME, code_same=False), "firewall", "d1", True),
    (dict(SAME, state_same=False), "firewall", "d1", True),
    (dict(SAME, applied={}), "firewall", "d1", True),
    (dict(SAME, applied={"raymetal_role_inputs": "not a mapping"}), "firewall", "d1", True),
    # The fast path off (raymetal_fast_path=false, tags, the acceptance gate): the probe was skipped.
    ({"skipped": True, "changed": False}, "firewall", "d1", True),
    ({}, "firewall", "d1", True),
    (None, "firewall", "d1", True),
    (SAME, "firewall", "", True),
])
def test_a_role_is_left_alone_only_where_its_inputs_alone_are_as_recorded(probe, role, digest, runs):
    assert d.role_converges(probe, role, digest) is runs


def test_role_hosts_groups_each_role_s_hosts_and_all_or_none_takes_every_host_or_none():
    hostvars = {
        "head": {"raymetal_role_runs_firewall": False, "raymetal_role_runs_monitoring": False},
        "w1": {"raymetal_role_runs_firewall": True, "raymetal_role_runs_monitoring": "True"},
        "w2": {"raymetal_role_runs_firewall": False, "raymetal_role_runs_monitoring": False},
    }
    hosts = ["head", "w1", "w2"]
    assert d.role_hosts(hosts, hostvars, ["firewall", "monitoring"], ["monitoring"]) == {
        "firewall": ["w1"], "monitoring": ["head", "w1", "w2"]}
    # Nowhere on one host: none, all or none or not.
    quiet = {h: {"raymetal_role_runs_firewall": False, "raymetal_role_runs_monitoring": "False"} for h in hosts}
    assert d.role_hosts(hosts, quiet, ["firewall", "monitoring"], ["monitoring"]) == {"firewall": [], "monitoring": []}
    # A host that did not decide runs the role; a play of no host groups none.
    assert d.role_hosts(hosts, {"head": {}, "w1": quiet["w1"]}, ["firewall"]) == {"firewall": ["head", "w2"]}
    assert d.role_hosts([], hostvars, ["firewall"], ["firewall"]) == {"firewall": []}


def test_role_hosts_patterns_name_each_role_s_group_or_no_host():
    hostvars = {"head": {"raymetal_role_runs_firewall": False}, "w1": {"raymetal_role_runs_firewall": True}}
    assert d.role_hosts(["head", "w1"], hostvars, ["firewall", "health"], [], True) == {
        "firewall": "raymetal_role_firewall", "health": "raymetal_role_health"}
    quiet = {"head": {"raymetal_role_runs_firewall": False}}
    assert d.role_hosts(["head"], quiet, ["firewall"], patterns=True) == {"firewall": "ray_head:&ray_worker"}
