"""Unit tests for plugins/modules/fabric_facts.py.

Each case under tests/fixtures/fabric/<case>/ holds a sysfs tree shaped like a
real host (sys/) and live.json: the interfaces, IPv4 addresses and default
route that the module must find on the live system. The tests create those
interfaces, recorded as ip-addr.json and ip-route.json (`ip -j addr show`,
`ip -j -4 route show default` run in a namespace built from live.json).

Every detection test runs twice: "recorded" feeds the recorded `ip -j` output
through a mocked run_command (no root needed); "netns" (root only, skipped
with a reason otherwise) creates those interfaces (Linux bridges named ib0,
ens1f0np0, ...) in a private network namespace and runs the module inside it,
so its `ip` calls are real. The namespaces never carry traffic and are
deleted in teardown, even on failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from unittest import mock

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from module_harness import REPO, ExitJson, FailJson
from module_harness import run_module as harness_run

from ansible_collections.raymetal.cluster.plugins.modules import fabric_facts

FIXTURES = REPO / "tests" / "fixtures" / "fabric"
CLONE_NEWNET = 0x40000000
ROOT_SKIP = "network namespace variant skipped: creating namespaces needs root (the recorded variant ran)"


@pytest.fixture(params=["recorded", "netns"])
def how(request):
    """How the module's `ip` calls are answered: recorded output, or a real namespace."""
    if request.param == "netns" and os.geteuid() != 0:
        pytest.skip(ROOT_SKIP)
    return request.param


BOTH_WAYS = pytest.mark.usefixtures("how")


def _ip(*args):
    subprocess.run(["ip"] + list(args), check=True, capture_output=True, text=True)


@contextlib.contextmanager
def fabric_netns(case):
    """Create a namespace holding the case's live interfaces; always delete it."""
    live = json.loads((FIXTURES / case / "live.json").read_text())
    name = "fabtest-%s" % uuid.uuid4().hex[:8]
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for link, addresses in live["links"].items():
            _ip("-n", name, "link", "add", link, "type", "bridge")
            for address in addresses:
                _ip("-n", name, "addr", "add", address, "dev", link)
            _ip("-n", name, "link", "set", link, "up")
        if live.get("default"):
            dev, gateway = live["default"]
            _ip("-n", name, "route", "add", "default", "via", gateway, "dev", dev)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


@contextlib.contextmanager
def inside_netns(name):
    """Move this thread (and the commands it starts) into the namespace, then back."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/self/ns/net", "rb") as original, open("/run/netns/%s" % name, "rb") as target:
        if libc.setns(target.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns(%s) failed" % name)
        try:
            yield
        finally:
            if libc.setns(original.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace failed")


def run_module(args, run_command=None):
    """Run main() with args; return (result, warnings) or raise FailJson."""
    warnings = []
    with mock.patch.object(basic.AnsibleModule, "warn", lambda self, msg: warnings.append(msg)):
        kind, result = harness_run(fabric_facts, args, run_command=run_command)
    if kind is FailJson:
        raise FailJson(result)
    return result, warnings


def recorded_ip(case):
    """A run_command answering `ip -j ...` from the case's recorded output."""
    answers = {
        ("-j", "addr", "show"): (FIXTURES / case / "ip-addr.json").read_text(),
        ("-j", "-4", "route", "show", "default"): (FIXTURES / case / "ip-route.json").read_text(),
    }

    def run_command(self, args, **kwargs):
        assert kwargs.get("environ_update", {}).get("LC_ALL") == "C", "ip must run with the C locale"
        key = tuple(args[1:])
        if os.path.basename(args[0]) != "ip" or key not in answers:
            return 1, "", "unexpected command %r" % (args,)
        return 0, answers[key], ""
    return run_command


def run_case(case, **args):
    """Run the module against a fixture case: recorded `ip` output, or its own namespace."""
    args.setdefault("sysfs_root", str(FIXTURES / case / "sys"))
    if CURRENT_HOW[0] == "netns":
        with fabric_netns(case) as ns, inside_netns(ns):
            return run_module(args)
    with mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: "/usr/sbin/" + name):
        return run_module(args, run_command=recorded_ip(case))


CURRENT_HOW = ["recorded"]


@pytest.fixture(autouse=True)
def _current_how(request):
    """run_case follows the test's `how` parameter (recorded when it has none)."""
    CURRENT_HOW[0] = request.node.callspec.params.get("how", "recorded") if hasattr(request.node, "callspec") else "recorded"
    yield
    CURRENT_HOW[0] = "recorded"


def fail_case(case, **args):
    """Like run_case, but the module must fail; returns its message."""
    with pytest.raises(FailJson) as failure:
        run_case(case, **args)
    return failure.value.result["msg"]


def by_name(fact):
    return dict((c["name"], c) for c in fact["candidates"])


# ---------------------------------------------------------------- detection


@BOTH_WAYS
def test_dgx_picks_first_active_ipoib_and_lists_active_ib_hcas():
    result, warnings = run_case("dgx")
    fact = result["ansible_facts"]["fabric"]
    assert result["changed"] is False
    assert warnings == []
    assert (fact["interface"], fact["address"], fact["prefix"], fact["kind"]) == ("ib0", "10.231.131.10", 24, "infiniband")
    # mlx5_3 is DOWN and mlx5_4 is an Ethernet (RoCE) port: neither belongs in NCCL_IB_HCA.
    assert fact["hcas"] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1"]
    cands = by_name(fact)
    assert "lo" not in cands
    assert cands["ib0"]["chosen"] is True
    assert [c["name"] for c in fact["candidates"] if c["chosen"]] == ["ib0"]
    assert cands["ib3"]["kind"] == "infiniband"
    assert "operstate is down" in cands["ib3"]["reason"]
    assert "mlx5_3:1 is DOWN" in cands["ib3"]["reason"]
    assert cands["ib1"]["reason"] == "usable, but ib0 was preferred"
    assert cands["enp225s0f0np0"]["kind"] == "roce"
    assert cands["eno1"]["kind"] == "ethernet"
    assert cands["ib2"]["address"] == "10.231.133.10/24"
    devices = dict((d["name"], d) for d in fact["rdma_devices"])
    assert devices["mlx5_0"] == {"name": "mlx5_0", "port": 1, "state": "ACTIVE", "link_layer": "InfiniBand",
                                 "rate": "200 Gb/sec (4X HDR)", "netdev": "ib0"}
    assert devices["mlx5_3"]["state"] == "DOWN"
    assert devices["mlx5_4"]["netdev"] == "enp225s0f0np0"


@BOTH_WAYS
def test_roce_only_picks_ethernet_netdev_bound_to_rdma_port():
    result, warnings = run_case("roce")
    fact = result["ansible_facts"]["fabric"]
    assert warnings == []
    assert (fact["interface"], fact["address"], fact["kind"]) == ("ens1f0np0", "10.231.136.11", "roce")
    assert fact["hcas"] == ["mlx5_0:1"]
    cands = by_name(fact)
    assert cands["ens1f1np1"]["kind"] == "roce"
    assert "no IPv4 address" in cands["ens1f1np1"]["reason"]
    assert "mlx5_1:1 is DOWN" in cands["ens1f1np1"]["reason"]
    assert cands["eno1"]["chosen"] is False


@BOTH_WAYS
def test_omnipath_ipoib_is_infiniband():
    result, _ = run_case("omnipath")
    fact = result["ansible_facts"]["fabric"]
    assert (fact["interface"], fact["address"], fact["kind"]) == ("ib0", "10.231.137.12", "infiniband")
    assert fact["hcas"] == ["hfi1_0:1"]
    assert fact["rdma_devices"][0]["rate"] == "100 Gb/sec (4X EDR)"


@BOTH_WAYS
def test_mlx4_dual_port_maps_ports_by_dev_port():
    result, _ = run_case("mlx4_dualport")
    fact = result["ansible_facts"]["fabric"]
    assert [(d["port"], d["netdev"], d["state"]) for d in fact["rdma_devices"]] == [(1, "ib0", "DOWN"), (2, "ib1", "ACTIVE")]
    assert fact["interface"] == "ib1"
    assert fact["hcas"] == ["mlx4_0:2"]


@BOTH_WAYS
def test_ipoib_without_ipv4_fails_when_rdma_required():
    msg = fail_case("ipoib_noaddr")
    assert "require_rdma is true" in msg
    assert "ib0 [infiniband, no IPv4]: no IPv4 address" in msg
    assert "eth0 [ethernet, 10.231.130.14/24]: not an RDMA interface" in msg


@BOTH_WAYS
def test_ipoib_without_ipv4_falls_back_when_allowed():
    result, warnings = run_case("ipoib_noaddr", require_rdma=False)
    fact = result["ansible_facts"]["fabric"]
    assert (fact["interface"], fact["address"], fact["kind"], fact["hcas"]) == ("eth0", "10.231.130.14", "ethernet", [])
    assert len(warnings) == 1 and "falling back to the default-route interface eth0" in warnings[0]


# ---------------------------------------------------------------- no RDMA


@BOTH_WAYS
def test_no_rdma_require_rdma_fails_listing_candidates():
    msg = fail_case("nordma", require_rdma=True)
    assert "no active InfiniBand or RoCE interface" in msg
    assert "eth0 [ethernet, 10.231.130.13/24]" in msg
    assert "docker0 [ethernet, 172.17.0.1/16]" in msg


@BOTH_WAYS
def test_no_rdma_falls_back_to_default_route_with_warning():
    result, warnings = run_case("nordma", require_rdma=False)
    fact = result["ansible_facts"]["fabric"]
    assert (fact["interface"], fact["address"], fact["prefix"], fact["kind"]) == ("eth0", "10.231.130.13", 24, "ethernet")
    assert fact["hcas"] == [] and fact["rdma_devices"] == []
    assert by_name(fact)["eth0"]["reason"].startswith("default-route interface")
    assert len(warnings) == 1 and "eth0 (10.231.130.13/24)" in warnings[0]


# ---------------------------------------------------------------- explicit interface


@BOTH_WAYS
def test_explicit_interface_missing_fails_listing_interfaces():
    msg = fail_case("nordma", interface="ib0", require_rdma=False)
    assert "interface 'ib0'" in msg and "does not exist" in msg
    assert "eth0 (10.231.130.13/24)" in msg and "docker0 (172.17.0.1/16)" in msg and "lo (127.0.0.1/8)" in msg


@BOTH_WAYS
def test_explicit_interface_without_ipv4_fails():
    msg = fail_case("ipoib_noaddr", interface="ib0")
    assert "interface 'ib0'" in msg and "has no IPv4 address" in msg


@BOTH_WAYS
def test_explicit_interface_overrides_detection():
    result, warnings = run_case("dgx", interface="ib2")
    fact = result["ansible_facts"]["fabric"]
    assert (fact["interface"], fact["address"], fact["kind"]) == ("ib2", "10.231.133.10", "infiniband")
    assert by_name(fact)["ib2"]["reason"] == "requested explicitly"
    assert warnings == []


@BOTH_WAYS
def test_explicit_ethernet_interface_needs_require_rdma_false():
    msg = fail_case("dgx", interface="eno1")
    assert "eno1" in msg and "set require_rdma=false" in msg
    result, _ = run_case("dgx", interface="eno1", require_rdma=False)
    fact = result["ansible_facts"]["fabric"]
    assert (fact["interface"], fact["kind"], fact["hcas"]) == ("eno1", "ethernet", [])


@BOTH_WAYS
def test_bad_sysfs_root_fails_naming_it(tmp_path):
    msg = fail_case("nordma", sysfs_root=str(tmp_path))
    assert str(tmp_path) in msg


# ---------------------------------------------------------------- through Ansible


@BOTH_WAYS
def test_module_runs_through_ansible_in_namespace():
    """The real module path: ansible ad-hoc inside the namespace, module copied and executed by Ansible."""
    ansible = Path(sys.executable).parent / "ansible"
    if not ansible.exists():
        pytest.skip("ansible is not installed next to this python")
    args = "sysfs_root=%s" % (FIXTURES / "roce" / "sys")
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "library"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.json")
    with fabric_netns("roce") as ns:
        proc = subprocess.run(["ip", "netns", "exec", ns, str(ansible), "localhost", "-c", "local",
                               "-e", "ansible_python_interpreter=%s" % sys.executable,
                               "-m", "fabric_facts", "-a", args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    fact = out["plays"][0]["tasks"][0]["hosts"]["localhost"]["ansible_facts"]["fabric"]
    assert (fact["interface"], fact["address"], fact["kind"], fact["hcas"]) == ("ens1f0np0", "10.231.136.11", "roce", ["mlx5_0:1"])


# ---------------------------------------------------------------- pure functions (no root)


def test_parse_ip_addr_prefers_global_primary_ipv4():
    text = json.dumps([{"ifname": "ib0", "operstate": "UP", "addr_info": [
        {"family": "inet6", "local": "fe80::1", "prefixlen": 64, "scope": "link"},
        {"family": "inet", "local": "169.254.0.5", "prefixlen": 16, "scope": "link"},
        {"family": "inet", "local": "10.0.0.9", "prefixlen": 24, "scope": "global", "secondary": True},
        {"family": "inet", "local": "10.0.0.5", "prefixlen": 24, "scope": "global"}]}])
    assert fabric_facts.parse_ip_addr(text) == {"ib0": {"operstate": "up", "ipv4": [
        ("10.0.0.5", 24), ("10.0.0.9", 24), ("169.254.0.5", 16)]}}


def test_parse_default_route_lowest_metric():
    text = json.dumps([{"dst": "default", "dev": "eth1", "metric": 200},
                       {"dst": "default", "dev": "eth0", "metric": 100}])
    assert fabric_facts.parse_default_route(text) == "eth0"
    assert fabric_facts.parse_default_route("[]") is None


def test_unparseable_ip_output_names_what_was_seen():
    with pytest.raises(fabric_facts.FabricError, match="garbage"):
        fabric_facts.parse_ip_addr("garbage")


def test_port_state_parsing():
    assert fabric_facts.parse_port_state("4: ACTIVE") == "ACTIVE"
    assert fabric_facts.parse_port_state("1: DOWN") == "DOWN"
    assert fabric_facts.parse_port_state(None) == "UNKNOWN"


def test_natural_sort_orders_ib10_after_ib2():
    assert sorted(["ib10", "ib2", "ib1"], key=fabric_facts.natural_key) == ["ib1", "ib2", "ib10"]


def test_read_rdma_ports_from_fixture_without_root():
    ports = fabric_facts.read_rdma_ports(str(FIXTURES / "dgx" / "sys"))
    assert [(p["name"], p["port"], p["netdev"], p["link_layer"]) for p in ports] == [
        ("mlx5_0", 1, "ib0", "InfiniBand"), ("mlx5_1", 1, "ib1", "InfiniBand"),
        ("mlx5_2", 1, "ib2", "InfiniBand"), ("mlx5_3", 1, "ib3", "InfiniBand"),
        ("mlx5_4", 1, "enp225s0f0np0", "Ethernet")]
    netdevs = fabric_facts.read_netdevs(str(FIXTURES / "dgx" / "sys"))
    assert netdevs["ib0"]["type"] == 32 and netdevs["eno1"]["type"] == 1 and netdevs["ib3"]["operstate"] == "down"


@BOTH_WAYS
def test_check_mode_returns_the_same_facts():
    result, _ = run_case("omnipath", _ansible_check_mode=True)
    assert result["changed"] is False
    assert result["ansible_facts"]["fabric"]["interface"] == "ib0"


def test_documentation_matches_argument_spec_and_facts():
    import yaml

    doc = yaml.safe_load(fabric_facts.DOCUMENTATION)
    ret = yaml.safe_load(fabric_facts.RETURN)
    yaml.safe_load(fabric_facts.EXAMPLES)
    with patch_module_args({}):
        module = fabric_facts.build_module()
    assert set(doc["options"]) == set(module.argument_spec)
    for name, spec in module.argument_spec.items():
        assert doc["options"][name]["type"] == spec["type"]
        assert doc["options"][name].get("default") == spec.get("default")
    documented = ret["ansible_facts"]["contains"]["fabric"]["contains"]
    fact, _ = fabric_facts.choose({}, [], {"eth0": {"operstate": "up", "ipv4": [("10.0.0.2", 24)]}}, "eth0",
                                  require_rdma=False)
    assert set(documented) == set(fact)
    assert set(documented["rdma_devices"]["contains"]) == {"name", "port", "state", "link_layer", "rate", "netdev"}
    assert set(documented["candidates"]["contains"]) == set(fact["candidates"][0])


def test_a_node_without_the_ip_command_is_told_to_install_iproute2():
    """The H100 host tools/gpu_host_check.sh ran on had no iproute2 (tests/fixtures/nvidia/recorded-h100-vm)."""
    with mock.patch.object(basic.AnsibleModule, "get_bin_path", lambda self, name, **kw: None):
        with pytest.raises(FailJson) as failure:
            run_module({"sysfs_root": str(FIXTURES / "dgx" / "sys")})
    assert failure.value.result["msg"] == ("the ip command is not installed; it reads the node's addresses and routes. "
                                           "Fix: install the iproute2 package on this node")
