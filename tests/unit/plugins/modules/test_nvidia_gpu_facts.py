"""Unit tests for plugins/modules/nvidia_gpu_facts.py against recorded PCI sysfs trees and nvidia-smi output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from module_harness import ExitJson, FailJson
from module_harness import run_module as harness_run

from ansible_collections.raymetal.cluster.plugins.modules import nvidia_gpu_facts as mod

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia"
SMI = FIXTURES / "smi"


H100_ADDRESSES = [
    "0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
    "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0",
]


def sysfs(name):
    return str(FIXTURES / name / "sys")


def run_module(args):
    return harness_run(mod, args)


# --- PCI detection -------------------------------------------------------------------------


def test_hgx_h100_eight_gpus_four_nvswitches():
    facts = mod.gpu_facts(sysfs("hgx-h100-8gpu"))
    assert facts["count"] == 8
    assert [d["pci_address"] for d in facts["devices"]] == H100_ADDRESSES
    assert {d["device_id"] for d in facts["devices"]} == {"0x2330"}
    assert {d["class"] for d in facts["devices"]} == {"0x030200"}
    assert facts["nvswitch_count"] == 4
    assert facts["has_nvswitch"] is True
    assert {s["device_id"] for s in facts["nvswitches"]} == {"0x22a3"}
    assert [s["pci_address"] for s in facts["nvswitches"]] == ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
    assert facts["open_kernel_modules_supported"] is True


def test_a100_pcie_two_gpus_and_a_matrox_bmc():
    facts = mod.gpu_facts(sysfs("a100-pcie-2gpu"))
    assert facts["count"] == 2
    assert facts["devices"] == [
        {"pci_address": "0000:17:00.0", "device_id": "0x20f1", "class": "0x030200"},
        {"pci_address": "0000:65:00.0", "device_id": "0x20f1", "class": "0x030200"},
    ]
    assert facts["nvswitch_count"] == 0
    assert facts["has_nvswitch"] is False


def test_rtx4090_vga_class_counts_but_its_audio_function_and_the_igpu_do_not():
    facts = mod.gpu_facts(sysfs("rtx4090-workstation"))
    assert facts["count"] == 1
    assert facts["devices"] == [{"pci_address": "0000:01:00.0", "device_id": "0x2684", "class": "0x030000"}]
    assert facts["has_nvswitch"] is False


def test_aspeed_bmc_only_host_has_no_gpu():
    facts = mod.gpu_facts(sysfs("aspeed-only"))
    assert facts == {
        "count": 0,
        "devices": [],
        "nvswitch_count": 0,
        "has_nvswitch": False,
        "nvswitches": [],
        "open_kernel_modules_supported": True,
    }


def test_pre_turing_gpu_is_not_open_module_capable(tmp_path):
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "device").write_text("0x1db4\n")  # Tesla V100 PCIe 16GB (Volta)
    (dev / "class").write_text("0x030200\n")
    assert mod.gpu_facts(str(tmp_path))["open_kernel_modules_supported"] is False


def test_unreadable_entries_are_skipped(tmp_path):
    devices = tmp_path / "bus" / "pci" / "devices"
    (devices / "0000:00:00.0").mkdir(parents=True)  # no id files at all
    bad = devices / "0000:01:00.0"
    bad.mkdir()
    (bad / "vendor").write_text("garbage\n")
    (bad / "device").write_text("0x2330\n")
    (bad / "class").write_text("0x030200\n")
    assert mod.gpu_facts(str(tmp_path))["count"] == 0


def test_module_returns_facts():
    kind, result = run_module({"sysfs_root": sysfs("hgx-h100-8gpu")})
    assert kind is ExitJson
    assert result["changed"] is False
    assert result["problems"] == []
    assert result["ansible_facts"]["nvidia_gpu"]["count"] == 8
    assert result["ansible_facts"]["nvidia_gpu"]["nvswitch_count"] == 4
    assert "nvidia_driver" not in result["ansible_facts"]
    json.dumps(result)  # facts must be JSON-serialisable


def test_module_fails_naming_a_missing_sysfs_tree(tmp_path):
    kind, result = run_module({"sysfs_root": str(tmp_path / "nothing")})
    assert kind is FailJson
    assert "cannot read the PCI bus: %s is not a sysfs tree" % (tmp_path / "nothing") in result["msg"]


def test_machine_without_a_pci_bus_has_no_gpu(tmp_path):
    (tmp_path / "bus" / "virtio").mkdir(parents=True)
    assert mod.gpu_facts(str(tmp_path))["count"] == 0


# --- nvidia-smi parsing and verification ---------------------------------------------------


def test_parse_smi_h100():
    smi = mod.parse_smi_csv((SMI / "hgx-h100-8gpu-570.csv").read_text())
    assert smi["driver_version"] == "570.133.20"
    assert smi["branch"] == "570"
    assert smi["count"] == 8
    assert smi["names"] == ["NVIDIA H100 80GB HBM3"] * 8
    assert smi["memory_total_mib"] == [81559] * 8
    assert [g["pci_address"] for g in smi["gpus"]] == H100_ADDRESSES


def test_parse_smi_not_supported_memory():
    smi = mod.parse_smi_csv("0, 00000000:01:00.0, NVIDIA GeForce RTX 4090, 570.133.20, [N/A]\n")
    assert smi["memory_total_mib"] == [None]


@pytest.mark.parametrize("fixture,needle", [
    ("csv-with-header.csv", "GPU index 'index' is not a number"),
    ("no-driver.txt", "expected 5 fields"),
])
def test_parse_smi_rejects_what_it_cannot_read(fixture, needle):
    with pytest.raises(mod.SmiError, match=needle):
        mod.parse_smi_csv((SMI / fixture).read_text())


def test_parse_smi_rejects_empty_and_mixed_versions():
    with pytest.raises(mod.SmiError, match="listed no GPU"):
        mod.parse_smi_csv("\n")
    mixed = "0, 0000:01:00.0, A, 570.133.20, 1\n1, 0000:02:00.0, B, 570.124.06, 1\n"
    with pytest.raises(mod.SmiError, match="different driver versions: 570.124.06, 570.133.20"):
        mod.parse_smi_csv(mixed)


@pytest.mark.parametrize("tree,smi_file", [
    ("hgx-h100-8gpu", "hgx-h100-8gpu-570.csv"),
    ("a100-pcie-2gpu", "a100-pcie-2gpu-570.csv"),
    ("rtx4090-workstation", "rtx4090-570.csv"),
])
def test_compare_matching(tree, smi_file):
    pci = mod.gpu_facts(sysfs(tree))
    smi = mod.parse_smi_csv((SMI / smi_file).read_text())
    assert mod.compare(pci, smi, "570") == []


def test_compare_missing_gpu_names_it():
    pci = mod.gpu_facts(sysfs("hgx-h100-8gpu"))
    smi = mod.parse_smi_csv((SMI / "hgx-h100-7gpu-570.csv").read_text())
    assert mod.compare(pci, smi, "570") == [
        "expected 8 GPUs (found on the PCI bus), nvidia-smi lists 7",
        "GPU 0000:9a:00.0 is on the PCI bus but nvidia-smi does not list it",
    ]


def test_compare_wrong_driver_branch_names_expected_and_seen():
    pci = mod.gpu_facts(sysfs("hgx-h100-8gpu"))
    smi = mod.parse_smi_csv((SMI / "hgx-h100-8gpu-550.csv").read_text())
    assert mod.compare(pci, smi, "570") == ["expected driver branch 570, loaded driver is 550.127.08"]
    assert mod.compare(pci, smi, "") == []  # no branch pinned: not checked


def test_compare_gpu_only_seen_by_smi():
    pci = mod.gpu_facts(sysfs("a100-pcie-2gpu"))
    smi = mod.parse_smi_csv((SMI / "rtx4090-570.csv").read_text())
    problems = mod.compare(pci, smi, "570")
    assert "nvidia-smi lists GPU 0000:01:00.0 which is not an NVIDIA GPU on the PCI bus" in problems


def _fake_smi(tmp_path, fixture, rc=0):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\ncat '%s'\nexit %d\n" % (SMI / fixture, rc))
    script.chmod(0o755)
    return str(script)


def test_module_query_smi_end_to_end(tmp_path):
    kind, result = run_module({
        "sysfs_root": sysfs("hgx-h100-8gpu"),
        "query_smi": True,
        "expected_branch": "570",
        "nvidia_smi_path": _fake_smi(tmp_path, "hgx-h100-7gpu-570.csv"),
    })
    assert kind is ExitJson
    assert result["ansible_facts"]["nvidia_driver"]["count"] == 7
    assert result["ansible_facts"]["nvidia_driver"]["driver_version"] == "570.133.20"
    assert "GPU 0000:9a:00.0 is on the PCI bus but nvidia-smi does not list it" in result["problems"]


def test_module_query_smi_failure_names_the_command_and_output(tmp_path):
    kind, result = run_module({
        "sysfs_root": sysfs("hgx-h100-8gpu"),
        "query_smi": True,
        "nvidia_smi_path": _fake_smi(tmp_path, "no-driver.txt", rc=9),
    })
    assert kind is FailJson
    assert "rc=9" in result["msg"]
    assert "couldn't communicate with the NVIDIA driver" in result["msg"]


# --- NVLink cliques (nvidia-smi -q, Fabric section) -------------------------------------------


def test_parse_fabric_of_a_gb200_clique():
    cliques = mod.parse_smi_fabric((SMI / "gb200-2gpu-q.txt").read_text())
    assert [c["pci_address"] for c in cliques] == ["0008:01:00.0", "0009:01:00.0"]
    assert {(c["state"], c["clique_id"], c["cluster_uuid"]) for c in cliques} == {
        ("Completed", "32766", "4b1f5c2e-7a0d-4e53-9f1b-2d6c8e0a9b31")}


def test_parse_fabric_not_applicable_on_h100_hgx():
    (gpu,) = mod.parse_smi_fabric((SMI / "hgx-h100-1gpu-q.txt").read_text())
    assert gpu == {"pci_address": "0000:18:00.0", "state": None, "status": None, "clique_id": None,
                   "cluster_uuid": None}


def test_module_reports_cliques_from_a_second_query(tmp_path):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\nif [ \"$1\" = -q ]; then cat '%s'; else cat '%s'; fi\n"
                      % (SMI / "gb200-2gpu-q.txt", SMI / "hgx-h100-8gpu-570.csv"))
    script.chmod(0o755)
    kind, result = run_module({"sysfs_root": sysfs("hgx-h100-8gpu"), "query_smi": True,
                               "nvidia_smi_path": str(script)})
    assert kind is ExitJson
    assert [c["clique_id"] for c in result["ansible_facts"]["nvidia_driver"]["fabric_cliques"]] == ["32766", "32766"]


def test_module_without_a_fabric_section_has_no_cliques(tmp_path):
    kind, result = run_module({"sysfs_root": sysfs("hgx-h100-8gpu"), "query_smi": True,
                               "nvidia_smi_path": _fake_smi(tmp_path, "hgx-h100-8gpu-570.csv")})
    assert kind is ExitJson
    assert result["ansible_facts"]["nvidia_driver"]["fabric_cliques"] == []
