"""playbooks/acceptance.yml end to end on localhost, through raymetal.runner.acceptance().

Three inventory hosts run locally, each reading a DGX H100 fixture tree (acceptance_sysfs_root),
so the real playbook, role, module, filter, JSON report and set_stats are exercised with no lab.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from raymetal import runner

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "fabric"

HOST = ('{ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}", '
        'ansible_become: false, raymetal_validate_require_systemd: false, acceptance_sysfs_root: "%s", acceptance_state_file: "%s"}')


def inventory(tmp_path, trees):
    """hosts.yml with one local host per fixture tree: head, worker1, ..."""
    lines = ["ray_cluster:", "  children:", "    ray_head:", "      hosts:"]
    names = ["head"] + ["worker%d" % i for i in range(1, len(trees))]
    for index, (name, tree) in enumerate(zip(names, trees)):
        if index == 1:
            lines += ["    ray_worker:", "      hosts:"]
        host = HOST % (FIXTURES / tree / "sys", tmp_path / ("%s.json" % name))
        lines.append("        %s: %s" % (name, host))
    site = tmp_path / "site"
    (site / "group_vars").mkdir(parents=True, exist_ok=True)
    (site / "hosts.yml").write_text("\n".join(lines) + "\n")
    (site / "group_vars" / "ray_cluster.yml").write_text(
        # Ray's venv is where the checks find Ray's Python (the ray role's ray_venv_path, wired to
        # acceptance_ray_python): this interpreter's venv.
        "ray_venv_path: %s\nacceptance_expected_gpus: 8\nacceptance_packages: []\n"
        # No traffic between local "hosts" that share one network stack; the lab tests the rings.
        "acceptance_traffic: false\nacceptance_ray_object: false\nacceptance_nccl_allreduce: false\n" % Path(sys.executable).parent.parent)
    return site


def test_healthy_nodes_pass_and_the_report_is_saved(tmp_path):
    site = inventory(tmp_path, ["dgx_h100", "dgx_h100", "dgx_h100"])
    report = runner.acceptance(str(site))
    assert report["failed"] is False
    assert report["summary"] == {"PASS": 3, "WARN": 0, "FAIL": 0}
    assert [line.split(":")[0] for line in report["lines"]] == ["head", "worker1", "worker2"]
    assert report["lines"][0].startswith("head: PASS 8 RDMA port(s) at 400 Gb/s, 8 GPU(s) PCIe x16")
    saved = Path(report["report_path"])
    assert saved.parent == site / "acceptance" and saved.name.startswith("acceptance-")
    on_disk = json.loads(saved.read_text())
    assert on_disk["lines"] == report["lines"] and on_disk["generated"] == report["generated"]
    # The counter record was written for the next run's growth check.
    assert json.loads((tmp_path / "worker1.json").read_text())["counters"]["mlx5_0:1"]["link_downed"] == 1


def test_a_failing_node_is_named_and_the_run_fails(tmp_path):
    site = inventory(tmp_path, ["dgx_h100", "dgx_h100_pcie_x8", "dgx_h100_mixed_fw"])
    with pytest.raises(runner.AcceptanceFailed) as err:
        runner.acceptance(str(site))
    report = err.value.report
    assert report["summary"] == {"PASS": 1, "WARN": 1, "FAIL": 1}
    assert report["lines"][1] == "worker1: FAIL GPU 0000:2a:00.0 PCIe link x8 of x16"
    assert report["lines"][2].startswith("worker2: WARN mixed HCA firmware")
    assert "worker1: FAIL GPU 0000:2a:00.0 PCIe link x8 of x16" in str(err.value)
    assert err.value.rc != 0
    assert Path(report["report_path"]).exists()


def test_flapping_link_fails_on_the_next_run(tmp_path):
    site = inventory(tmp_path, ["dgx_h100", "dgx_h100"])
    runner.acceptance(str(site))
    flapping = inventory(tmp_path, ["dgx_h100", "dgx_h100_flapping"])  # same state files
    with pytest.raises(runner.AcceptanceFailed) as err:
        runner.acceptance(str(flapping))
    assert err.value.report["lines"][1].startswith(
        "worker1: FAIL mlx5_2:1 (ib2) is flapping since the last check: link_downed +3, symbol_error +187")


def test_report_only_mode_returns_failures_without_raising(tmp_path):
    site = inventory(tmp_path, ["dgx_h100", "dgx_h100_no_peermem"])
    report = runner.acceptance(str(site), extravars={"acceptance_fail_on_fail": False})
    assert report["failed"] is True
    assert report["nodes"]["worker1"]["verdict"] == "FAIL"
    assert "nvidia_peermem is not loaded" in report["lines"][1]
