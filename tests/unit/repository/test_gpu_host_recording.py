"""raymetal's GPU-facing code against what it read on a real GPU host.

tests/fixtures/nvidia/recorded-h100-vm/ was recorded by tools/gpu_host_check.sh on one NVIDIA H100
80GB HBM3 (driver 580.159.04, CUDA 13, a Firecracker VM; the README there says how and when). Unlike
the other fixtures, nothing in it was written by hand: sys/ holds the sysfs files the modules read,
smi.csv and smi-q.txt what nvidia-smi printed, modules.json what the modules returned there, labels.yaml
the labels raymetal derived, ray_gpu.json what the Ray node started with those labels reported, and
ray_nccl.json / nccl.log the acceptance role's NCCL all-reduce through Ray on that GPU.

Today's code, given the same inputs here, must give the same answers.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import yaml
from module_harness import ExitJson
from module_harness import run_module as harness_run

from ansible_collections.raymetal.cluster.plugins.filter import acceptance
from ansible_collections.raymetal.cluster.plugins.modules import node_checks
from ansible_collections.raymetal.cluster.plugins.modules import nvidia_gpu_facts
from ansible_collections.raymetal.cluster.plugins.filter import ray_labels

REPO = Path(__file__).resolve().parents[3]
RECORDED = REPO / "tests" / "fixtures" / "nvidia" / "recorded-h100-vm"


def _load_ray_nccl():
    """roles/acceptance/files/ray_nccl.py as a module (its KEEP pattern picks the log lines it sends back)."""
    spec = importlib.util.spec_from_file_location("ray_nccl", REPO / "roles" / "acceptance" / "files" / "ray_nccl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RAY_NCCL = _load_ray_nccl()
THERE = json.loads((RECORDED / "modules.json").read_text())


def recorded_smi(tmp_path, recorded=RECORDED):
    """An nvidia-smi that prints what the real one printed: `-q`, else the module's CSV query."""
    script = tmp_path / "nvidia-smi"
    script.write_text('#!/bin/sh\nif [ "$1" = -q ]; then cat "%s"; else cat "%s"; fi\n'
                      % (recorded / "smi-q.txt", recorded / "smi.csv"))
    script.chmod(0o755)
    return str(script)


def test_nvidia_gpu_facts_reads_the_recorded_host_as_it_did_there(tmp_path):
    kind, result = harness_run(nvidia_gpu_facts, {"sysfs_root": str(RECORDED / "sys"), "query_smi": True,
                                                  "expected_branch": "580", "nvidia_smi_path": recorded_smi(tmp_path)})
    assert kind is ExitJson
    assert result["ansible_facts"] == THERE["nvidia_gpu_facts"]["ansible_facts"]
    assert result["problems"] == THERE["nvidia_gpu_facts"]["problems"] == []
    gpu, driver = result["ansible_facts"]["nvidia_gpu"], result["ansible_facts"]["nvidia_driver"]
    # The PCI bus (no driver needed) and nvidia-smi agree on the one GPU, at the VM's PCI address.
    assert [d["pci_address"] for d in gpu["devices"]] == [g["pci_address"] for g in driver["gpus"]] == ["0000:00:06.0"]
    assert (gpu["devices"][0]["device_id"], driver["names"], driver["branch"]) == ("0x2330", ["NVIDIA H100 80GB HBM3"], "580")
    # An H100 outside a multi-node NVLink domain: its Fabric section is all N/A.
    assert driver["fabric_cliques"] == [{"pci_address": "0000:00:06.0", "state": None, "status": None,
                                         "clique_id": None, "cluster_uuid": None}]


def test_a_pinned_branch_other_than_the_loaded_driver_is_named(tmp_path):
    _, result = harness_run(nvidia_gpu_facts, {"sysfs_root": str(RECORDED / "sys"), "query_smi": True,
                                               "expected_branch": "570", "nvidia_smi_path": recorded_smi(tmp_path)})
    assert result["problems"] == ["expected driver branch 570, loaded driver is 580.159.04"]


def test_node_checks_reads_the_recorded_pcie_link_and_driver_as_it_did_there():
    facts = node_checks.collect(str(RECORDED / "sys"))
    there = THERE["node_checks"]["ansible_facts"]["node_checks"]
    assert facts["pcie"] == there["pcie"] == [{
        "address": "0000:00:06.0", "kind": "gpu", "vendor": "0x10de", "device": "0x2330", "name": None,
        "speed_gts": 32.0, "max_speed_gts": 32.0, "width": 16, "max_width": 16}]
    assert (facts["gpu_count"], facts["nvidia_peermem"], facts["ports"]) == (1, False, [])
    assert facts["versions"]["nvidia_driver"] == there["versions"]["nvidia_driver"] == "580.159.04"
    # No RDMA port, so no nvidia_peermem is no finding; one GPU expected, one found.
    assert node_checks.evaluate(facts, expected_gpus=1) == there["findings"] == []
    assert [f["message"] for f in node_checks.evaluate(facts, expected_gpus=8)] == [
        "1 GPU(s) on the PCI bus, 8 expected"]


def test_the_labels_raymetal_derived_there_are_the_ones_the_ray_node_carried():
    facts = THERE["nvidia_gpu_facts"]["ansible_facts"]
    labels = ray_labels.ray_node_labels({}, facts["nvidia_gpu"], facts["nvidia_driver"], "localhost")
    assert labels == yaml.safe_load((RECORDED / "labels.yaml").read_text()) == {
        "ray.io/gpu-domain": "localhost", "raymetal.io/gpu-count": "1", "raymetal.io/gpu-memory-gib": "80",
        "raymetal.io/gpu-model": "NVIDIA-H100-80GB-HBM3"}
    assert ray_labels.ray_label_problems(labels) == []
    ray = json.loads((RECORDED / "ray_gpu.json").read_text())
    (node,) = ray["nodes"]
    # Ray 2.60 accepted every label from --labels-file and added its own accelerator type.
    assert dict(node["labels"], **labels) == node["labels"]
    assert node["labels"]["ray.io/accelerator-type"] == "H100"
    assert (node["resources"]["GPU"], node["resources"]["accelerator_type:H100"]) == (1.0, 1.0)
    # The label_selector on gpu-model of docs/jobs.md placed a task on that GPU, which CuPy used.
    assert ray["task"]["device_name"] == "NVIDIA H100 80GB HBM3"
    assert (ray["task"]["cuda_visible_devices"], ray["task"]["sum_ok"]) == ("0", True)


def test_nccl_through_ray_on_one_real_gpu_is_a_note_not_a_fabric_figure():
    res = {"rc": 0, "stdout": (RECORDED / "ray_nccl.json").read_text(), "stderr": ""}
    hostvars = {"gpu1": {"ansible_facts": {"fabric": {"address": "192.0.2.2", "kind": "infiniband"}}}}
    (item,) = acceptance.nccl_allreduce_items(res, ["gpu1"], hostvars)
    # NCCL loaded from the wheel in the venv and summed right on the GPU.
    assert item["library"].endswith("site-packages/nvidia/nccl/lib/libnccl.so.2")
    assert (item["src"], item["ranks"], item["error"], item["version"]) == ("gpu1", 1, None, "2.28.9+cuda13.0")
    # With one rank NCCL still says "Using network Socket" (and took 18 us for 256 MiB): neither is a
    # reading of the fabric, so an InfiniBand cluster with one GPU node gets a note, not a NET/Socket failure.
    assert (item["transport"], item["busbw_gbs"], item["algbw_gbs"]) == (None, None, None)
    assert "no network used" in item["note"]
    report = acceptance.acceptance_report({"gpu1": {"findings": []}}, traffic=[item])
    assert report["failed"] is False and report["summary"]["PASS"] == 1
    assert report["lines"][0].endswith(item["note"])


def test_nccl_transport_reads_the_recorded_nccl_228_log():
    log = (RECORDED / "nccl.log").read_text()
    # NCCL 2.28 with no HCA: "NET/IB : No device found", "NET/IB : Using [RO]" (no device listed), then Socket.
    assert acceptance.nccl_transport(log) == {"network": "Socket", "transport": "NET/Socket", "gdrdma": False,
                                              "version": "2.28.9+cuda13.0", "ib_devices": []}
    kept = "".join(line for line in log.splitlines(keepends=True) if RAY_NCCL.KEEP.search(line))
    assert acceptance.nccl_transport(kept) == acceptance.nccl_transport(log)


def test_node_checks_reports_a_cuda_13_stack_in_rays_venv(tmp_path, monkeypatch):
    """On the H100 host Ray's Python had cupy-cuda13x and nvidia-nccl-cu13, which node_checks did not
    look for (it reported NCCL and CuPy as absent); the CUDA 12 names are still read."""
    def dist(name, version):
        info = tmp_path / ("%s-%s.dist-info" % (name.replace("-", "_"), version))
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version))

    for name, version in (("cupy-cuda13x", "14.2.0"), ("nvidia-nccl-cu13", "2.28.9"), ("nvidia-cuda-runtime", "13.0.96")):
        dist(name, version)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    args = {"sysfs_root": str(RECORDED / "sys"), "state_file": "", "packages": [], "python": sys.executable,
            "kernel_log": "", "nvidia_proc": str(tmp_path / "no-driver"), "nvidia_smi": "/bin/true"}
    _, result = harness_run(node_checks, args)
    versions = result["ansible_facts"]["node_checks"]["versions"]
    assert (versions["nccl"], versions["cupy"], versions["cuda"]) == ("2.28.9", "14.2.0", "13.0.96")

    for name in ("cupy-cuda13x", "nvidia-nccl-cu13", "nvidia-cuda-runtime"):
        next(tmp_path.glob(name.replace("-", "_") + "-*.dist-info")).rename(tmp_path / ("gone-" + name))
    for name, version in (("cupy-cuda12x", "13.4.1"), ("nvidia-nccl-cu12", "2.32.3"), ("nvidia-cuda-runtime-cu12", "12.8.90")):
        dist(name, version)
    _, result = harness_run(node_checks, args)
    versions = result["ansible_facts"]["node_checks"]["versions"]
    assert (versions["nccl"], versions["cupy"], versions["cuda"]) == ("2.32.3", "13.4.1", "12.8.90")


# tests/fixtures/nvidia/recorded-h200-vm/: the same script on one NVIDIA H200 (driver 580.159.04, CUDA 13,
# a Firecracker VM with the unified cgroup v2 hierarchy), a day later. Its README says what else it holds.
H200 = REPO / "tests" / "fixtures" / "nvidia" / "recorded-h200-vm"
THERE_H200 = json.loads((H200 / "modules.json").read_text())


def test_nvidia_gpu_facts_reads_the_recorded_h200_as_it_did_there(tmp_path):
    kind, result = harness_run(nvidia_gpu_facts, {"sysfs_root": str(H200 / "sys"), "query_smi": True,
                                                  "expected_branch": "580", "nvidia_smi_path": recorded_smi(tmp_path, H200)})
    assert kind is ExitJson
    assert result["ansible_facts"] == THERE_H200["nvidia_gpu_facts"]["ansible_facts"]
    gpu, driver = result["ansible_facts"]["nvidia_gpu"], result["ansible_facts"]["nvidia_driver"]
    assert (gpu["devices"][0]["device_id"], driver["names"], driver["memory_total_mib"]) == (
        "0x2335", ["NVIDIA H200"], [143771])


def test_the_h200_labels_are_the_ones_its_ray_node_carried():
    facts = THERE_H200["nvidia_gpu_facts"]["ansible_facts"]
    labels = ray_labels.ray_node_labels({}, facts["nvidia_gpu"], facts["nvidia_driver"], "localhost")
    assert labels == yaml.safe_load((H200 / "labels.yaml").read_text()) == {
        "ray.io/gpu-domain": "localhost", "raymetal.io/gpu-count": "1", "raymetal.io/gpu-memory-gib": "140",
        "raymetal.io/gpu-model": "NVIDIA-H200"}
    ray = json.loads((H200 / "ray_gpu.json").read_text())
    (node,) = ray["nodes"]
    assert dict(node["labels"], **labels) == node["labels"]
    assert (node["labels"]["ray.io/accelerator-type"], node["resources"]["accelerator_type:H200"]) == ("H200", 1.0)
    assert (ray["task"]["device_name"], ray["task"]["sum_ok"]) == ("NVIDIA H200", True)


def test_rays_resource_isolation_ran_on_a_real_cgroup_v2_host_as_raymetal_decided():
    """The lab's hosts are cgroup v1; this is the one run of --enable-resource-isolation on cgroup v2."""
    from ansible_collections.raymetal.cluster.plugins.filter import ray_isolation

    recorded = json.loads((H200 / "isolation.json").read_text())
    facts = recorded["facts"]
    assert (facts["cgroup2"], facts["cpus"], facts["kernel"]) == (True, 16, "6.18.44-fc-v657-gpu")
    assert {"cpu", "memory"} <= set(facts["controllers"])
    # Today's decision on those facts is the one recorded there: on.
    assert ray_isolation.ray_isolation_plan(facts) == recorded["plan"]
    assert recorded["plan"]["enabled"] is True
    # Ray 2.60 with the unit's flags (--cgroup-path, 2 cores and 2 GiB reserved) built its tree under the
    # delegated cgroup: its own processes in system/leaf, the task's worker in user/workers.
    run = json.loads((H200 / "isolation-run.json").read_text())
    tree = run["tree"]
    (node_dir,) = [name for name in tree if name.startswith("ray-node_") and "/" not in name]
    assert {"raylet", "gcs_server"} <= set(tree[node_dir + "/system/leaf"]["procs"])
    assert "ray::IDLE" in tree[node_dir + "/user/workers"]["procs"]
    assert run["task_cgroup"] == "0::/raymetal-check/%s/user/workers" % node_dir
    # The reserved cores are a cpu.weight: 2 of 16 cores is 1250 of 10000 for Ray, 8750 for jobs.
    assert (tree[node_dir + "/system"]["cpu.weight"], tree[node_dir + "/user"]["cpu.weight"]) == ("1250", "8750")
    # `ray stop` left the tree behind (6 directories). Under raymetal's unit it lies inside the unit's own
    # cgroup; that systemd removes it when the unit stops was not seen there (no systemd in that VM).
    assert (H200 / "isolation-after-stop.txt").read_text().count(node_dir) == 6
