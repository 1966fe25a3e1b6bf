"""node_checks on recorded sysfs trees shaped like a DGX H100 (tests/fixtures/fabric/dgx_h100*).

Each tree is a healthy DGX H100 (8 GPUs 0x2330 at PCIe Gen5 x16, 8 ConnectX-7 at NDR 400 Gb/s,
nvidia_peermem loaded) with one thing changed; see make_fixtures.py. The module runs through
main() with Ansible's exit_json/fail_json patched, so argument parsing and the fact are real.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import yaml

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from module_harness import ExitJson, FailJson
from module_harness import run_module as run_harnessed

from ansible_collections.raymetal.cluster.plugins.modules import node_checks

REPO = Path(__file__).resolve().parents[4]
FIXTURES = REPO / "tests" / "fixtures" / "fabric"


def run_module(args):
    """(result, warnings) of node_checks.main(); a fail_json raises FailJson, as it does in the harness."""
    warnings = []
    with mock.patch.object(basic.AnsibleModule, "warn", lambda self, msg: warnings.append(msg)):
        outcome, result = run_harnessed(node_checks, args)
    if outcome is FailJson:
        raise FailJson(result)
    assert outcome is ExitJson
    return result, warnings


def check(case, tmp_path, **args):
    args.setdefault("sysfs_root", str(FIXTURES / case / "sys"))
    args.setdefault("state_file", str(tmp_path / "state.json"))
    args.setdefault("packages", [])
    # This machine's own GPU stack and kernel log stay out: an nvidia-smi that reports no GPU row, no
    # driver listing, no kernel log (tests/unit/plugins/module_utils/test_health_checks.py feeds recorded ones).
    smi = tmp_path / "nvidia-smi-none"
    smi.write_text("#!/bin/sh\nexit 0\n")
    smi.chmod(0o755)
    args.setdefault("nvidia_smi", str(smi))
    args.setdefault("nvidia_proc", str(tmp_path / "no-driver"))
    args.setdefault("kernel_log", "")
    result, warnings = run_module(args)
    assert result["changed"] is False
    return result["ansible_facts"]["node_checks"], warnings


def messages(fact, severity=None):
    return [f["message"] for f in fact["findings"] if severity is None or f["severity"] == severity]


def test_healthy_dgx_h100_has_no_findings(tmp_path):
    fact, warnings = check("dgx_h100", tmp_path, expected_gpus=8)
    assert warnings == []
    assert fact["findings"] == []
    assert fact["gpu_count"] == 8
    assert fact["nvidia_peermem"] is True
    assert fact["versions"]["nvidia_driver"] == "570.133.20"
    assert fact["hca_firmware"] == dict(("mlx5_%d" % i, "28.39.1002") for i in range(8))
    assert [(p["name"], p["netdev"], p["state"], p["phys_state"], p["rate_gbps"]) for p in fact["ports"]] == [
        ("mlx5_%d" % i, "ib%d" % i, "ACTIVE", "LinkUp", 400.0) for i in range(8)]
    assert fact["ports"][0]["counters"]["link_downed"] == 1
    assert "port_rcv_data" not in fact["ports"][0]["counters"]  # data counters are not errors
    gpus = [p for p in fact["pcie"] if p["kind"] == "gpu"]
    hcas = [p for p in fact["pcie"] if p["kind"] == "hca"]
    assert len(gpus) == 8 and all(g["device"] == "0x2330" and g["max_speed_gts"] == 32.0 for g in gpus)
    assert sorted(h["name"] for h in hcas) == ["mlx5_%d" % i for i in range(8)]
    # An idle H100 downclocks its link to 2.5 GT/s: normal, not a finding.
    assert [g["speed_gts"] for g in gpus].count(2.5) == 1
    assert fact["baseline"] == "new"


def test_degraded_port_fails_with_rate_and_state(tmp_path):
    fact, _ = check("dgx_h100_degraded_port", tmp_path)
    fails = messages(fact, "fail")
    assert "mlx5_5:1 (ib5) rate 200 Gb/s, other InfiniBand ports 400 Gb/s" in fails
    assert "mlx5_6:1 (ib6) is DOWN, physical state Polling" in fails
    assert len(fails) == 2


def test_ignored_port_is_left_out(tmp_path):
    fact, _ = check("dgx_h100_degraded_port", tmp_path, ignore_ports=["mlx5_6:1"])
    assert [f["subject"] for f in fact["findings"]] == ["mlx5_5:1"]
    assert "mlx5_6" not in [p["name"] for p in fact["ports"]]


def test_flapping_counter_fails_on_the_second_run_only(tmp_path):
    first, _ = check("dgx_h100", tmp_path)
    assert first["findings"] == [] and first["baseline"] == "new"
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["counters"]["mlx5_2:1"]["link_downed"] == 1
    second, _ = check("dgx_h100_flapping", tmp_path)
    assert second["baseline"] == "compared"
    by_subject = dict((f["subject"], f) for f in second["findings"])
    assert by_subject["mlx5_2:1"]["severity"] == "fail"
    assert by_subject["mlx5_2:1"]["message"] == (
        "mlx5_2:1 (ib2) is flapping since the last check: link_downed +3, symbol_error +187")
    assert by_subject["mlx5_4:1"]["severity"] == "warn"
    assert by_subject["mlx5_4:1"]["message"] == "mlx5_4:1 (ib4) error counters grew since the last check: port_rcv_errors +12"
    assert second["ports"][0]["growth"] == dict((c, 0) for c in second["ports"][0]["counters"])
    # The same counters again: no growth, no finding.
    third, _ = check("dgx_h100_flapping", tmp_path)
    assert third["findings"] == []


def test_counter_reset_starts_a_new_baseline(tmp_path):
    check("dgx_h100_flapping", tmp_path)
    after_reboot, _ = check("dgx_h100", tmp_path)  # link_downed 4 -> 1: counters were reset
    assert after_reboot["findings"] == []
    assert after_reboot["ports"][2]["growth"] is None


def test_check_mode_does_not_write_the_record(tmp_path):
    check("dgx_h100", tmp_path, _ansible_check_mode=True)
    assert not (tmp_path / "state.json").exists()


def test_corrupt_record_is_a_warning_and_a_new_baseline(tmp_path):
    (tmp_path / "state.json").write_text("{not json")
    fact, warnings = check("dgx_h100", tmp_path)
    assert fact["baseline"] == "new"
    assert len(warnings) == 1 and "state.json" in warnings[0]
    assert json.loads((tmp_path / "state.json").read_text())["counters"]["mlx5_0:1"]["link_downed"] == 1


def test_unwritable_record_fails_naming_the_path_and_fix(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FailJson) as failure:
        check("dgx_h100", tmp_path, state_file=str(blocker / "sub" / "state.json"))
    assert str(blocker / "sub" / "state.json") in failure.value.result["msg"]
    assert "fix:" in failure.value.result["msg"]


def test_pcie_x8_of_x16_fails(tmp_path):
    fact, _ = check("dgx_h100_pcie_x8", tmp_path)
    assert messages(fact) == ["GPU 0000:2a:00.0 PCIe link x8 of x16"]
    assert fact["findings"][0]["check"] == "pcie_width"


def test_mixed_firmware_warns_naming_both_versions(tmp_path):
    fact, _ = check("dgx_h100_mixed_fw", tmp_path)
    assert messages(fact) == ["mixed HCA firmware: mlx5_7 28.37.1014; mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6 28.39.1002"]
    assert fact["findings"][0]["severity"] == "warn"
    assert fact["hca_firmware"]["mlx5_7"] == "28.37.1014"


def test_missing_peermem_fails_only_when_required(tmp_path):
    fact, _ = check("dgx_h100_no_peermem", tmp_path)
    assert fact["nvidia_peermem"] is False
    assert len(fact["findings"]) == 1
    assert fact["findings"][0]["message"].startswith("nvidia_peermem is not loaded: 8 GPU(s) and 8 active RDMA port(s)")
    relaxed, _ = check("dgx_h100_no_peermem", tmp_path, require_peermem=False)
    assert relaxed["findings"] == []


def test_gpu_count_against_the_inventory(tmp_path):
    fact, _ = check("dgx_h100", tmp_path, expected_gpus=4)
    assert messages(fact, "fail") == ["8 GPU(s) on the PCI bus, 4 expected"]


def test_node_without_rdma_or_gpus_passes(tmp_path):
    fact, _ = check("nordma", tmp_path)
    assert (fact["ports"], fact["pcie"], fact["gpu_count"], fact["findings"]) == ([], [], 0, [])


def test_roce_ports_are_checked_with_their_netdev(tmp_path):
    fact, _ = check("roce", tmp_path)
    assert [(p["name"], p["link_layer"], p["netdev"]) for p in fact["ports"]] == [
        ("mlx5_0", "Ethernet", "ens1f0np0"), ("mlx5_1", "Ethernet", "ens1f1np1")]
    assert messages(fact) == ["mlx5_1:1 (ens1f1np1) is DOWN, physical state Disabled"]


def test_not_a_sysfs_tree_fails_naming_it(tmp_path):
    with pytest.raises(FailJson) as failure:
        check("dgx_h100", tmp_path, sysfs_root=str(tmp_path))
    assert str(tmp_path) in failure.value.result["msg"]


def test_package_versions_from_dpkg_query():
    module = mock.Mock()
    module.get_bin_path.side_effect = lambda name: "/usr/bin/dpkg-query" if name == "dpkg-query" else None
    module.run_command.side_effect = [(0, "ii |44.0-2", ""), (1, "", "no packages found matching perftest")]
    assert node_checks.package_versions(module, ["rdma-core", "perftest"]) == {"rdma-core": "44.0-2", "perftest": None}


def test_parsers():
    assert node_checks.parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert node_checks.parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert node_checks.parse_rate("invalid") is None
    assert node_checks.parse_link_speed("32.0 GT/s PCIe") == 32.0
    assert node_checks.parse_link_speed("8 GT/s") == 8.0
    assert node_checks.parse_link_speed("Unknown") is None
    assert node_checks.strip_number("5: LinkUp") == "LinkUp"


def test_documentation_matches_argument_spec_and_fact(tmp_path):
    doc = yaml.safe_load(node_checks.DOCUMENTATION)
    ret = yaml.safe_load(node_checks.RETURN)
    yaml.safe_load(node_checks.EXAMPLES)
    with patch_module_args({}):
        module = node_checks.build_module()
    assert set(doc["options"]) == set(module.argument_spec)
    for name, spec in module.argument_spec.items():
        assert doc["options"][name]["type"] == spec["type"]
        assert doc["options"][name].get("default") == spec.get("default")
    documented = ret["ansible_facts"]["contains"]["node_checks"]["contains"]
    fact, _ = check("dgx_h100_degraded_port", tmp_path)
    assert set(documented) == set(fact)
    assert set(documented["ports"]["contains"]) == set(fact["ports"][0])
    assert set(documented["pcie"]["contains"]) == set(fact["pcie"][0])
    # "class" is only on the GPU faults the health loop acts on (tests/unit/plugins/module_utils/test_health_checks.py).
    assert set(documented["findings"]["contains"]) - {"class"} == set(fact["findings"][0])


def test_venv_versions_from_a_real_python(tmp_path):
    fact, _ = check("nordma", tmp_path, python=sys.executable)
    import platform

    assert fact["versions"]["python"] == platform.python_version()
    assert set(fact["versions"]) >= {"python", "ray", "nccl", "cupy", "cuda", "kernel", "nvidia_driver"}
    assert fact["findings"] == []


def test_a_python_that_does_not_answer_is_a_failure_not_a_hang(tmp_path, monkeypatch):
    # A hung filesystem under the venv held acceptance (and the deploy's gate) for as long as the interpreter hung.
    monkeypatch.setattr(node_checks, "VERSIONS_TIMEOUT", 2, raising=False)
    hung = tmp_path / "venv" / "bin" / "python"
    hung.parent.mkdir(parents=True)
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(0o755)
    started = time.monotonic()
    fact, _ = check("nordma", tmp_path, python=str(hung))
    assert time.monotonic() - started < 30
    finding = fact["findings"][0]
    assert finding["severity"] == "fail" and fact["versions"]["ray"] is None
    assert finding["message"] == ("%s did not report versions within 2 s (a hung filesystem under the venv?): it was "
                                  "stopped" % hung)


def test_missing_venv_is_a_failure_with_the_fix(tmp_path):
    fact, _ = check("nordma", tmp_path, python=str(tmp_path / "venv" / "bin" / "python"))
    assert fact["findings"][0]["severity"] == "fail"
    assert "does not exist (fix: deploy first" in fact["findings"][0]["message"]
    assert fact["versions"]["ray"] is None


def test_link_rate_of_the_fabric_interface(tmp_path):
    fact, _ = check("dgx_h100", tmp_path, interface="ib3")
    assert fact["link"] == {"interface": "ib3", "gbps": 400.0, "source": "mlx5_3:1"}
    fact, _ = check("dgx_h100", tmp_path)
    assert fact["link"] is None
    speed = tmp_path / "sys" / "class" / "net" / "eth9"
    speed.mkdir(parents=True)
    (speed / "speed").write_text("10000\n")
    assert node_checks.link_rate(str(tmp_path / "sys"), "eth9", []) == {"interface": "eth9", "gbps": 10.0, "source": "speed"}
    assert node_checks.link_rate(str(tmp_path / "sys"), "nope", [])["gbps"] is None
