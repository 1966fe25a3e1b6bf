"""plugins/filter/raymetal.py: port validation and address summaries."""

from __future__ import annotations

import pathlib

from ansible_collections.raymetal.cluster.plugins.filter import raymetal as f

ROOT = pathlib.Path(__file__).resolve().parents[4]

DEFAULT_PORTS = {
    "ray_gcs_port": 6379, "ray_dashboard_port": 8265, "ray_client_server_port": 10001,
    "ray_dashboard_agent_listen_port": 52365, "ray_dashboard_agent_grpc_port": 6383,
    "ray_node_manager_port": 6380, "ray_object_manager_port": 6381,
    "ray_runtime_env_agent_port": 6382, "ray_metrics_export_port": 6384,
}


def test_the_role_defaults_have_no_problems():
    assert f.port_problems(DEFAULT_PORTS, 10002, 19999) == []


def test_duplicates_are_named_both_ways():
    ports = dict(DEFAULT_PORTS, ray_node_manager_port=6379)
    assert f.port_problems(ports, 10002, 19999) == ["port 6379 is used by ray_gcs_port and ray_node_manager_port"]


def test_out_of_range_and_non_numbers():
    ports = dict(DEFAULT_PORTS, ray_gcs_port=80, ray_dashboard_port="http", ray_metrics_export_port=70000)
    problems = f.port_problems(ports, 10002, 19999)
    assert "ray_gcs_port=80 is outside 1024-65535" in problems
    assert "ray_dashboard_port='http' is not a port number" in problems
    assert "ray_metrics_export_port=70000 is outside 1024-65535" in problems


def test_a_port_inside_the_worker_range_is_refused():
    # 10001 is fine with Ray's range 10002-19999, not with 10000-19999.
    problems = f.port_problems(DEFAULT_PORTS, 10000, 19999)
    assert problems == ["ray_client_server_port=10001 is inside the worker port range 10000-19999"]


def test_an_inverted_worker_range_is_refused():
    assert f.port_problems(DEFAULT_PORTS, 20000, 19999) == [
        "worker port range 20000-19999 is invalid (need 1024 <= min < max <= 65535)"
    ]


def test_ipv4_by_interface():
    facts = {
        "interfaces": ["lo", "ib0", "eth0", "br-x"],
        "ib0": {"device": "ib0", "ipv4": {"address": "10.0.0.5", "prefix": "24"}},
        "eth0": {"device": "eth0", "ipv4": {"address": "192.0.2.5", "prefix": "24"}},
        "lo": {"device": "lo", "ipv4": {"address": "127.0.0.1", "prefix": "8"}},
        "br_x": {"device": "br-x"},
    }
    assert f.ipv4_by_interface(facts) == "eth0=192.0.2.5/24, ib0=10.0.0.5/24, lo=127.0.0.1/8"
    assert f.ipv4_by_interface({"interfaces": []}) == "none"


def test_node_software_lines():
    hostvars = {
        "gpu1": {"nccl_version": "2.32.3",
                 "ansible_facts": {"nvidia_gpu": {"count": 8}, "nvidia_driver": {"driver_version": "570.133.20"}}},
        "cpu1": {"ansible_facts": {}},
    }
    assert f.node_software_lines(["gpu1", "cpu1"], hostvars) == [
        "gpu1: NCCL 2.32.3, 8 GPU(s), driver 570.133.20",
        "cpu1: NCCL not verified, 0 GPU(s), driver none",
    ]
    # A host that took the fast path per host: the roles did not run there, and its line says so.
    assert f.node_software_lines(["gpu1", "cpu1"], hostvars, ["cpu1"]) == [
        "gpu1: NCCL 2.32.3, 8 GPU(s), driver 570.133.20",
        "cpu1: unchanged since the last deploy (fast path)",
    ]


def test_interface_of_ipv4_finds_primary_and_secondary_addresses():
    interface_of_ipv4 = f.interface_of_ipv4
    facts = {"interfaces": ["lo", "eth0", "ib0"],
             "eth0": {"ipv4": {"address": "10.1.0.5"}},
             "ib0": {"ipv4": {"address": "10.2.0.5"}, "ipv4_secondaries": [{"address": "10.3.0.5"}]},
             "lo": {"ipv4": {"address": "127.0.0.1"}}}
    assert interface_of_ipv4(facts, "10.2.0.5") == "ib0"
    assert interface_of_ipv4(facts, "10.3.0.5") == "ib0"
    assert interface_of_ipv4(facts, "10.9.9.9") == ""
    assert interface_of_ipv4(facts, "") == ""


def test_os_problems_names_each_host_that_raymetal_cannot_deploy_on():
    hostvars = {
        "ok": {"ansible_facts": {"service_mgr": "systemd", "os_family": "Debian"}},
        "sysv": {"ansible_facts": {"service_mgr": "sysvinit", "os_family": "Debian"}},
        "arch": {"ansible_facts": {"service_mgr": "systemd", "os_family": "Archlinux", "distribution": "Archlinux",
                                   "distribution_version": "rolling"}},
        "arch_allowed": {"ansible_facts": {"service_mgr": "systemd", "os_family": "Archlinux"},
                         "raymetal_allow_unsupported_os": "true"},
        "no_systemd_needed": {"ansible_facts": {"service_mgr": "openrc", "os_family": "Debian"},
                              "raymetal_validate_require_systemd": False},
        "down": {"__validate_setup": {"unreachable": True}},
    }
    assert f.os_problems(list(hostvars), hostvars, ["Debian", "RedHat"]) == {
        "sysv": "service manager is sysvinit, not systemd",
        "arch": "Archlinux rolling (Archlinux family) is not supported",
    }
    assert f.os_problems([], hostvars, ["Debian"]) == {}


def test_removal_path_problems_refuses_what_raymetal_did_not_make():
    bad = {"ray_gcs_storage_path": "/home", "a": "/", "b": "/var/lib", "c": "/home/alice", "d": "/root/x",
           "e": "relative/gcs", "f": "/var/lib/ray/../../..", "g": "/usr/", "h": "//etc//systemd/"}
    problems = f.removal_path_problems(bad)
    assert len(problems) == len(bad)
    assert problems[0].startswith("ray_gcs_storage_path=/home is the root or a top-level directory")
    assert all("Fix:" in p for p in problems)
    good = {"ray_gcs_storage_path": "/var/lib/ray/gcs", "ray_state_dir": "/var/lib/ray", "ray_config_dir": "/etc/ray",
            "ray_temp_dir": "/var/lib/ray/tmp", "ray_venv_path": "/opt/ray/venv",
            "ray_wheelhouse_dir": "/var/cache/raymetal/wheelhouse", "x": "/srv/raymetal/gcs"}
    assert f.removal_path_problems(good) == []
