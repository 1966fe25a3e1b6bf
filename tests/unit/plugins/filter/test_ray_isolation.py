"""Ray's cgroup v2 resource isolation: the decision per node (plugins/filter/ray_isolation.py), the probe that feeds
it (roles/ray/files/ray_node_probe.py) and the unit it renders (roles/ray/templates/ray.service.j2).

The lab's host runs cgroup v1, so isolation cannot run there (the lab test checks that the deploy says so and
leaves the unit as it was); these tests cover the cgroup v2 side from recorded node reports: a Debian 12 /
Ubuntu 24.04-style unified host, a hybrid host, an old kernel, a host without the memory controller.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jinja2
import pytest
import yaml

from ansible_collections.raymetal.cluster.plugins.filter import ray_isolation as iso

ROOT = Path(__file__).resolve().parents[4]


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


probe_mod = _load("ray_node_probe", ROOT / "roles" / "ray" / "files" / "ray_node_probe.py")
plan, lines_of = iso.FilterModule().filters()["ray_isolation_plan"], iso.FilterModule().filters()["ray_isolation_lines"]

GIB = 1024 ** 3
# What the probe reports on a cgroup v2 host (systemd 252+, kernel 6.1) with 64 cores and 512 GiB.
UNIFIED = {"cgroup2": True, "controllers": ["cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc"],
           "kernel": "6.1.0-27-amd64", "cpus": 64, "memory_bytes": 512 * GIB}


def test_a_unified_cgroup_v2_host_gets_isolation_by_default():
    got = plan(UNIFIED, "auto")
    assert got["enabled"] and got["problem"] == ""
    assert got["reason"].startswith("on: Ray's default cores")


def test_cgroup_v1_is_off_under_auto_and_refused_under_true():
    node = dict(UNIFIED, cgroup2=False, controllers=[])
    auto = plan(node, "auto")
    assert not auto["enabled"] and auto["problem"] == ""
    assert "cgroup v1" in auto["reason"] and "systemd.unified_cgroup_hierarchy=1" in auto["reason"]
    forced = plan(node, True)
    assert not forced["enabled"]
    assert forced["problem"].startswith("ray_resource_isolation is true but this node cannot")
    assert "Fix: set ray_resource_isolation to auto" in forced["problem"]


@pytest.mark.parametrize("change, words", [
    ({"kernel": "5.4.0-150-generic"}, "kernel 5.4.0-150-generic is older than 5.8"),
    ({"controllers": ["cpu", "pids"]}, "the memory controller is not available"),
    ({"controllers": ["pids"]}, "the cpu and memory controllers are not available"),
    ({"cpus": 1}, "1 CPU"),
])
def test_each_missing_requirement_is_named(change, words):
    got = plan(dict(UNIFIED, **change), "auto")
    assert not got["enabled"] and words in got["reason"], got
    assert words in plan(dict(UNIFIED, **change), "true")["problem"]


def test_false_turns_it_off_even_where_it_could_run():
    got = plan(UNIFIED, False)
    assert not got["enabled"] and got["problem"] == "" and "false" in got["reason"]


def test_a_setting_that_is_not_auto_true_or_false_is_a_problem():
    assert "is not auto, true or false" in plan(UNIFIED, "sometimes")["problem"]


@pytest.mark.parametrize("cpu, memory, words", [
    (0.5, None, "ray_system_reserved_cpu=0.5 must be at least 1"),
    (64, None, "below the node's 64 CPUs"),
    (None, 100 * 1024 ** 2, "ray_system_reserved_memory=104857600 must be at least 524288000"),
    (None, 600 * GIB, "below the node's"),
])
def test_reservations_ray_would_refuse_fail_preflight(cpu, memory, words):
    got = plan(UNIFIED, "auto", cpu, memory)
    assert not got["enabled"] and words in got["problem"], got


def test_explicit_reservations_are_reported():
    got = plan(UNIFIED, "auto", 2, 8 * GIB)
    assert got["enabled"] and got["reason"] == "on: 2 cores and 8.0 GiB reserved for Ray's own processes"


def test_summary_lines_group_hosts_by_outcome():
    hostvars = {"head": {"ray_resource_isolation_plan": plan(UNIFIED, "auto")},
                "w1": {"ray_resource_isolation_plan": plan(dict(UNIFIED, cgroup2=False), "auto")},
                "w2": {"ray_resource_isolation_plan": plan(dict(UNIFIED, cgroup2=False), "auto")},
                "w3": {}}
    got = lines_of(hostvars, ["head", "w1", "w2", "w3"])
    assert got[0].startswith("Resource isolation")
    assert got[1] == "  on: head"
    assert got[2].startswith("  w1, w2: off: cgroup v1")
    assert lines_of({"w3": {}}, ["w3"]) == []


def test_the_probe_reads_a_unified_and_a_hybrid_cgroup_root(tmp_path):
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16318480 kB\nMemFree:         1000 kB\n")
    got = probe_mod.isolation_facts(str(unified), str(meminfo))
    assert got["cgroup2"] and got["controllers"] == ["cpuset", "cpu", "io", "memory", "pids"]
    assert got["memory_bytes"] == 16318480 * 1024 and got["cpus"] >= 1 and got["kernel"]
    hybrid = tmp_path / "hybrid"
    (hybrid / "unified").mkdir(parents=True)  # v1 controllers beside an empty v2 mount
    (hybrid / "memory").mkdir()
    assert probe_mod.isolation_facts(str(hybrid), str(meminfo))["cgroup2"] is False


# --- the unit ------------------------------------------------------------------------------------------------

def render_unit(isolation, **overrides):
    defaults = yaml.safe_load((ROOT / "roles" / "ray" / "defaults" / "main.yml").read_text())
    values = {k: v for k, v in defaults.items() if "{{" not in str(v)}
    values.update(ansible_managed="Ansible managed", __ray_is_head=False, __ray_head_host="head",
                  hostvars={"head": {"ray_node_ip": "10.1.0.1"}}, __ray_wait_script="/w", __ray_start_script="/s",
                  __ray_restart_record="/var/lib/ray/restarts.json",
                  __ray_venv="/opt/ray/venv-2.60.0", __ray_dashboard_host="10.1.0.1", __ray_num_gpus=8,
                  __ray_labels_path="/etc/ray/labels.yaml", __ray_isolation=isolation, __ray_gcs_store=False,
                  __ray_cgroup_path="/sys/fs/cgroup/system.slice/ray-worker.service", ray_node_ip="10.1.0.2",
                  ray_node_interface="ib0", ray_config_dir="/etc/ray", ray_state_dir="/var/lib/ray",
                  ray_temp_dir="/var/lib/ray/tmp", ray_auth_token_path="/etc/ray/auth_token", ray_unit_ip_allow=[])
    values.update(overrides)
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    return env.from_string((ROOT / "roles" / "ray" / "templates" / "ray.service.j2").read_text()).render(values)


def directives(text):
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_with_isolation_the_unit_delegates_its_cgroup_and_passes_it_to_ray():
    text = directives(render_unit(True, ray_system_reserved_cpu=2, ray_system_reserved_memory=8 * GIB))
    assert "--enable-resource-isolation \\" in text
    assert "--cgroup-path=/sys/fs/cgroup/system.slice/ray-worker.service \\" in text
    assert "--system-reserved-cpu=2.0 \\" in text and "--system-reserved-memory=8589934592 \\" in text
    assert "Delegate=cpu memory" in text
    assert "ReadWritePaths=/sys/fs/cgroup/system.slice/ray-worker.service" in text
    assert "ProtectControlGroups=yes" not in text
    # the rest of the hardening stays
    assert {"NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=", "ProtectKernelTunables=yes"} <= set(text)


def test_without_isolation_the_unit_is_as_before():
    text = directives(render_unit(False, ray_system_reserved_cpu=2))
    assert not [line for line in text if "isolation" in line or "cgroup-path" in line or "reserved" in line]
    assert "ProtectControlGroups=yes" in text and not [line for line in text if line.startswith("Delegate=")]


def test_ray_default_reservations_are_not_passed():
    text = directives(render_unit(True))
    assert "--enable-resource-isolation \\" in text
    assert not [line for line in text if "--system-reserved" in line]


def test_the_unit_records_its_stops_for_the_backoff_unless_it_is_off():
    text = directives(render_unit(False))
    assert text[text.index("[Service]"):].count("ExecStart=/s --backoff-max=60 --state=/var/lib/ray/restarts.json ib0 "
                                                "10.1.0.2 /etc/ray/auth_token -- \\") == 1, text
    assert "ExecStop=/s --stopping /var/lib/ray/restarts.json" in text
    assert "ExecStopPost=/s --stopped /var/lib/ray/restarts.json" in text
    off = directives(render_unit(False, ray_restart_backoff_max=0))
    assert "ExecStart=/s ib0 10.1.0.2 /etc/ray/auth_token -- \\" in off
    assert not [line for line in off if line.startswith(("ExecStop=", "ExecStopPost="))]


def test_by_host_skips_hosts_without_a_plan():
    hostvars = {"head": {"ray_resource_isolation_plan": plan(UNIFIED, "auto")}, "w1": {}}
    assert list(iso.ray_isolation_by_host(hostvars, ["head", "w1", "ghost"])) == ["head"]


def test_by_host_takes_the_plan_the_fast_path_gave_back_as_a_fact():
    """With nothing changed since the last deploy, preflight does not run: the recorded plan is a fact."""
    recorded = plan(UNIFIED, "auto")
    hostvars = {"w1": {"ansible_facts": {"ray_resource_isolation_plan": recorded}}, "w2": {"ansible_facts": {}}}
    assert iso.ray_isolation_by_host(hostvars, ["w1", "w2"]) == {"w1": dict(recorded)}
