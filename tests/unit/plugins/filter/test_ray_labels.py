"""plugins/filter/ray_labels.py: node labels derived from recorded fabric and GPU facts, and Ray's label rules.

The fabric facts come from the fabric_facts module's own selection on the recorded sysfs trees (tests/unit/recorded_fabric.py,
as for nccl.conf); the GPU facts from nvidia_gpu_facts on recorded PCI trees and nvidia-smi output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.raymetal.cluster.plugins.filter import ray_cluster as rc
from ansible_collections.raymetal.cluster.plugins.filter import ray_labels as labels_mod
from ansible_collections.raymetal.cluster.plugins.modules import nvidia_gpu_facts
from recorded_fabric import facts_of

ROOT = Path(__file__).resolve().parents[4]

FILTERS = labels_mod.FilterModule().filters()
node_labels, label_problems = FILTERS["ray_node_labels"], FILTERS["ray_label_problems"]

NVIDIA = ROOT / "tests" / "fixtures" / "nvidia"


def gpu(tree):
    return nvidia_gpu_facts.gpu_facts(str(NVIDIA / tree / "sys"))


def driver(csv, q=None):
    smi = nvidia_gpu_facts.parse_smi_csv((NVIDIA / "smi" / csv).read_text())
    smi["fabric_cliques"] = nvidia_gpu_facts.parse_smi_fabric((NVIDIA / "smi" / q).read_text()) if q else []
    return smi


def test_dgx_h100_infiniband_eight_gpus_one_host_domain():
    fabric = facts_of("dgx_h100")
    labels = node_labels(fabric, gpu("hgx-h100-8gpu"), driver("hgx-h100-8gpu-570.csv", "hgx-h100-1gpu-q.txt"),
                         "dgx07", {"rack": "r12", "leaf": "leaf3"})
    assert labels == {
        "raymetal.io/fabric": "infiniband",
        "raymetal.io/rdma-rails": str(len(fabric["hcas"])),
        "raymetal.io/link-rate-gbps": "400",
        "raymetal.io/gpu-count": "8",
        "raymetal.io/gpu-model": "NVIDIA-H100-80GB-HBM3",
        "raymetal.io/gpu-memory-gib": "80",
        "ray.io/gpu-domain": "dgx07",  # no multi-node NVLink: the host is its own domain
        "raymetal.io/leaf": "leaf3",
        "raymetal.io/rack": "r12",
    }
    assert len(fabric["hcas"]) >= 4
    assert label_problems(labels) == []


def test_a_degraded_rail_sets_the_rate_to_the_slowest_active_rail():
    labels = node_labels(facts_of("dgx_h100_degraded_port"), {}, {}, "dgx08")
    rates = {p["rate"] for p in facts_of("dgx_h100_degraded_port")["rdma_devices"]
             if f"{p['name']}:{p['port']}" in facts_of("dgx_h100_degraded_port")["hcas"]}
    assert len(rates) > 1, rates  # the fixture really has a rail at another rate
    assert labels["raymetal.io/link-rate-gbps"] == str(min(int(r.split()[0]) for r in rates))


def test_gb200_gpus_share_their_nvlink_clique_as_gpu_domain():
    labels = node_labels(facts_of("roce"), {"count": 2}, driver("a100-pcie-2gpu-570.csv", "gb200-2gpu-q.txt"), "gb-n1")
    assert labels["ray.io/gpu-domain"] == "4b1f5c2e-7a0d-4e53-9f1b-2d6c8e0a9b31.32766"
    assert labels["raymetal.io/fabric"] == "roce"
    assert label_problems(labels) == []


def test_no_gpu_no_rdma_carries_its_fabric_kind_only():
    assert node_labels(facts_of("nordma", require_rdma=False), {"count": 0}, {}, "cpu1") == {
        "raymetal.io/fabric": "ethernet"}


@pytest.mark.parametrize("labels, needle", [
    ({"raymetal.io/rack": "rack 12"}, "its value 'rack 12'"),
    ({"Bad_Prefix.io/x": "1"}, "its prefix 'Bad_Prefix.io'"),
    ({"-team": "a"}, "its name '-team'"),
    ({"team": ["a"]}, "must be a string or a number"),
    ({"x" * 64: "a"}, "must be 1-63 characters"),
])
def test_labels_ray_would_refuse_are_named(labels, needle):
    problems = label_problems(labels)
    assert len(problems) == 1 and needle in problems[0], problems


def test_numbers_and_empty_values_are_fine():
    assert label_problems({"raymetal.io/row": 4, "team": ""}) == []


def test_the_summary_shows_raymetals_site_and_topology_labels_not_rays_internal_ones():
    node = {"ip": "10.0.0.2", "state": "ALIVE", "resources": {"CPU": 2},
            "labels": {"ray.io/node-id": "abc", "ray.io/gpu-domain": "dgx07", "raymetal.io/fabric": "infiniband",
                       "raymetal.io/rack": "r12", "team": "vision"}}
    dead = dict(node, ip="10.0.0.3", state="DEAD")
    lines = rc.ray_summary_table({"nodes": [node, dead], "nodes_alive": 1}, {"w1": "10.0.0.2", "w2": "10.0.0.3"})
    at = lines.index("Labels (raymetal.io/ keys without their prefix):")
    assert lines[at + 1] == "  w1: fabric=infiniband rack=r12 ray.io/gpu-domain=dgx07 team=vision"
    assert not any(line.startswith("  w2:") for line in lines)
    assert "node-id" not in "\n".join(lines)
