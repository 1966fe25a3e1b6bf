"""Verdict logic of playbooks/acceptance.yml (plugins/filter/acceptance.py).

Node records come from the real node_checks module run on the DGX H100 fixture trees, so the
filter sees exactly what the playbook hands it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ansible_collections.raymetal.cluster.plugins.filter import acceptance
from ansible_collections.raymetal.cluster.plugins.modules import node_checks

REPO = Path(__file__).resolve().parents[4]
FIXTURES = REPO / "tests" / "fixtures" / "fabric"
VERSIONS = {"kernel": "6.1.0-28-amd64", "nvidia_driver": "570.133.20", "rdma-core": "44.0-2",
            "python": "3.11.2", "ray": "2.60.0", "nccl": "2.32.3", "cupy": "13.4.1", "cuda": "12.8.90"}


def record(case="dgx_h100", **versions):
    facts = node_checks.collect(str(FIXTURES / case / "sys"))
    facts["versions"] = dict(VERSIONS, **versions)
    facts["findings"] = node_checks.evaluate(facts)
    return facts


def healthy_cluster(n=4):
    nodes = {"head": record()}
    for i in range(1, n):
        nodes["worker%d" % i] = record()
    return nodes


def test_healthy_cluster_passes_with_figures():
    report = acceptance.acceptance_report(healthy_cluster())
    assert report["failed"] is False
    assert report["summary"] == {"PASS": 4, "WARN": 0, "FAIL": 0}
    assert report["lines"][0] == ("head: PASS 8 RDMA port(s) at 400 Gb/s, 8 GPU(s) PCIe x16, "
                                  "nvidia_peermem loaded, Ray 2.60.0")
    assert report["drift"] == []


def test_slow_node_fails_against_the_cluster_rate():
    nodes = healthy_cluster()
    for port in nodes["worker3"]["ports"]:
        port["rate_gbps"], port["rate"] = 100.0, "100 Gb/sec (4X EDR)"
    report = acceptance.acceptance_report(nodes)
    assert report["failed"] is True
    assert report["summary"] == {"PASS": 3, "WARN": 0, "FAIL": 1}
    line = [item for item in report["lines"] if item.startswith("worker3:")][0]
    assert line.startswith("worker3: FAIL ib0 rate 100 Gb/s, others 400 Gb/s; ib1 rate 100 Gb/s")
    assert report["nodes"]["worker1"]["verdict"] == "PASS"


def test_degraded_port_on_one_node_is_named_once():
    nodes = healthy_cluster(3)
    nodes["worker2"] = record("dgx_h100_degraded_port")
    report = acceptance.acceptance_report(nodes)
    assert report["nodes"]["worker2"]["verdict"] == "FAIL"
    messages = [f["message"] for f in report["nodes"]["worker2"]["findings"]]
    assert sorted(messages) == ["mlx5_5:1 (ib5) rate 200 Gb/s, other InfiniBand ports 400 Gb/s",
                                "mlx5_6:1 (ib6) is DOWN, physical state Polling"]


@pytest.mark.parametrize("case,verdict,text", [
    ("dgx_h100_pcie_x8", "FAIL", "GPU 0000:2a:00.0 PCIe link x8 of x16"),
    ("dgx_h100_no_peermem", "FAIL", "nvidia_peermem is not loaded"),
    ("dgx_h100_mixed_fw", "WARN", "mixed HCA firmware: mlx5_7 28.37.1014"),
])
def test_each_node_failure_kind_turns_that_node(case, verdict, text):
    nodes = healthy_cluster(3)
    nodes["worker1"] = record(case)
    report = acceptance.acceptance_report(nodes)
    assert report["nodes"]["worker1"]["verdict"] == verdict
    assert text in report["lines"][1]
    assert report["lines"][1].startswith("worker1: %s " % verdict)
    assert report["nodes"]["head"]["verdict"] == "PASS" and report["nodes"]["worker2"]["verdict"] == "PASS"


def test_drift_names_every_difference_and_the_majority():
    nodes = healthy_cluster()
    nodes["worker2"]["versions"]["kernel"] = "6.1.0-27-amd64"
    nodes["worker3"]["versions"]["ray"] = "2.59.0"
    nodes["worker3"]["versions"]["nccl"] = "2.21.5"
    report = acceptance.acceptance_report(nodes)
    assert report["nodes"]["worker2"]["verdict"] == "WARN"
    assert report["lines"][2] == "worker2: WARN kernel 6.1.0-27-amd64, others 6.1.0-28-amd64 (head, worker1, worker3)"
    assert report["nodes"]["worker3"]["verdict"] == "FAIL"
    assert [f["message"] for f in report["nodes"]["worker3"]["findings"]] == [
        "NCCL 2.21.5, others 2.32.3 (head, worker1, worker2)", "Ray 2.59.0, others 2.60.0 (head, worker1, worker2)"]
    assert sorted((d["host"], d["key"]) for d in report["drift"]) == [
        ("worker2", "kernel"), ("worker3", "nccl"), ("worker3", "ray")]


def test_firmware_drift_across_nodes():
    nodes = healthy_cluster(3)
    for port in nodes["worker1"]["ports"]:
        port["fw_ver"] = "28.37.1014"
    nodes["worker1"]["hca_firmware"] = dict((k, "28.37.1014") for k in nodes["worker1"]["hca_firmware"])
    report = acceptance.acceptance_report(nodes)
    assert report["lines"][1] == "worker1: WARN HCA firmware 28.37.1014, others 28.39.1002 (head, worker2)"


def test_two_node_tie_is_judged_against_the_head():
    nodes = healthy_cluster(2)
    nodes["worker1"]["versions"]["python"] = "3.12.1"
    report = acceptance.acceptance_report(nodes)
    assert report["nodes"]["head"]["verdict"] == "PASS"
    assert report["lines"][1] == "worker1: FAIL Python 3.12.1, others 3.11.2 (head)"


def test_pinned_versions_are_checked_on_every_node_and_empty_pins_ignored():
    nodes = healthy_cluster(2)
    report = acceptance.acceptance_report(nodes, pinned={"ray": "2.61.0", "kernel": "", "nccl": None})
    assert report["summary"]["FAIL"] == 2
    assert "Ray 2.60.0, pinned 2.61.0" in report["lines"][0]
    assert all(d["against"] == "pinned" for d in report["drift"])


def test_drift_severity_is_configurable():
    nodes = healthy_cluster(3)
    nodes["worker1"]["versions"]["kernel"] = "6.8.0-45-generic"
    report = acceptance.acceptance_report(nodes, fail_keys=["kernel"])
    assert report["nodes"]["worker1"]["verdict"] == "FAIL"


def test_missing_versions_compare_as_none():
    nodes = healthy_cluster(3)
    nodes["worker2"]["versions"]["nvidia_driver"] = None
    report = acceptance.acceptance_report(nodes)
    assert report["lines"][2] == "worker2: FAIL NVIDIA driver none, others 570.133.20 (head, worker1)"


def test_host_without_facts_fails_with_the_reason():
    hostvars = {"head": {"ansible_facts": {"node_checks": record()}},
                "worker1": {"ansible_facts": {}, "__acceptance_error": "Failed to connect to the host via ssh"}}
    nodes = acceptance.acceptance_nodes(["head", "worker1"], hostvars)
    report = acceptance.acceptance_report(nodes)
    assert report["lines"][1] == "worker1: FAIL no node checks: Failed to connect to the host via ssh"
    assert report["nodes"]["head"]["verdict"] == "PASS"


def test_traffic_below_threshold_or_failed_fails_the_sender():
    nodes = healthy_cluster(3)
    traffic = [
        {"kind": "iperf3", "src": "head", "dst": "worker1", "gbps": 9.4, "threshold_gbps": 5.0},
        {"kind": "iperf3", "src": "worker1", "dst": "worker2", "gbps": 1.2, "threshold_gbps": 5.0},
        {"kind": "iperf3", "src": "worker2", "dst": "head", "error": "iperf3 is not installed"},
    ]
    report = acceptance.acceptance_report(nodes, traffic=traffic)
    assert report["nodes"]["head"]["verdict"] == "PASS"
    assert "iperf3 to worker2 1.20 Gb/s, below 5.00 Gb/s" in report["lines"][1]
    assert report["lines"][2].startswith("worker2: FAIL iperf3 to head: iperf3 is not installed")
    assert report["lines"][0].endswith("Ray 2.60.0, iperf3 to worker1 9.40 Gb/s")
    assert len(report["lines"]) == 3


def test_ring_is_linear_in_the_node_count():
    assert acceptance.ring_pairs(["a"]) == []
    assert acceptance.ring_pairs(["a", "b"]) == [("a", "b"), ("b", "a")]
    hosts = ["n%d" % i for i in range(10)]
    pairs = acceptance.ring_pairs(hosts)
    assert len(pairs) == 10
    assert sorted(s for s, _ in pairs) == sorted(hosts) and sorted(r for _, r in pairs) == sorted(hosts)
    assert acceptance.ring_next("n9", hosts) == "n0"


def test_input_is_not_modified():
    nodes = healthy_cluster(2)
    before = copy.deepcopy(nodes)
    acceptance.acceptance_report(nodes, pinned={"ray": "1"})
    assert nodes == before


# ---------------------------------------------------------------- traffic

TRAFFIC = REPO / "tests" / "fixtures" / "traffic"


def test_iperf3_result_from_a_recorded_lab_run():
    res = {"rc": 0, "stdout": (TRAFFIC / "iperf3_ok.json").read_text(), "stderr": ""}
    item = acceptance.iperf3_result(res, "head", "worker1", 2.5)
    assert item["error"] is None
    assert item["gbps"] == 6.382 and item["retransmits"] == 915 and item["threshold_gbps"] == 2.5


def test_iperf3_refused_names_iperf3s_reason():
    res = {"rc": 1, "stdout": (TRAFFIC / "iperf3_refused.json").read_text(), "stderr": ""}
    item = acceptance.iperf3_result(res, "head", "worker1")
    assert item["gbps"] is None
    assert item["error"] == "iperf3 failed (rc=1): unable to connect to server: Connection refused"


def test_iperf3_timeout_missing_and_skipped():
    assert "timed out" in acceptance.iperf3_result({"rc": 124, "stdout": "", "stderr": ""}, "a", "b")["error"]
    assert acceptance.iperf3_result({}, "a", "b", missing="iperf3 is not installed on a")["error"] == \
        "iperf3 is not installed on a"
    assert acceptance.iperf3_result({"skipped": True, "skip_reason": "Conditional result was False"},
                                    "a", "b")["error"].startswith("not run")


def test_thresholds_are_a_fraction_of_the_slower_link_or_absolute():
    assert acceptance.threshold_gbps({"gbps": 400.0}, {"gbps": 200.0}, 0.9) == 180.0
    assert acceptance.threshold_gbps({"gbps": 10.0}, None, 0.25) == 2.5
    assert acceptance.threshold_gbps({"gbps": 400.0}, {"gbps": 400.0}, 0.9, 5) == 5.0
    assert acceptance.threshold_gbps({}, {}, 0.9) is None


def test_ib_write_bw_parsing_in_both_units():
    item = acceptance.ib_write_bw_result((TRAFFIC / "ib_write_bw_gbits.txt").read_text(), "a", "b", 360.0)
    assert (item["gbps"], item["bytes"], item["error"]) == (391.84, 65536, None)
    item = acceptance.ib_write_bw_result((TRAFFIC / "ib_write_bw_mbytes_all.txt").read_text(), "a", "b")
    assert item["bytes"] == 8388608 and item["gbps"] == round(24201.36 * 8 / 1000, 3)
    failed = acceptance.ib_write_bw_result((TRAFFIC / "ib_write_bw_failed.txt").read_text(), "a", "b")
    assert failed["gbps"] is None and "Couldn't connect to 10.231.140.21:18515" in failed["error"]


def test_rdma_pair_below_ninety_percent_fails_the_sender():
    nodes = healthy_cluster(2)
    slow = acceptance.ib_write_bw_result((TRAFFIC / "ib_write_bw_mbytes_all.txt").read_text(), "worker1", "head",
                                         acceptance.threshold_gbps({"gbps": 400.0}, {"gbps": 400.0}, 0.9))
    report = acceptance.acceptance_report(nodes, traffic=[slow])
    assert report["lines"][1] == "worker1: FAIL ib_write_bw to head 193.61 Gb/s, below 360.00 Gb/s"


def test_an_ib_write_bw_run_becomes_a_pair_or_names_why_not():
    text = (TRAFFIC / "ib_write_bw_gbits.txt").read_text()
    ok = acceptance.ib_write_bw_run({"rc": 0, "stdout": text}, "head", "worker1", 360.0)
    assert (ok["kind"], ok["src"], ok["dst"], ok["gbps"], ok["error"]) == ("ib_write_bw", "head", "worker1", 391.84, None)
    failed_text = (TRAFFIC / "ib_write_bw_failed.txt").read_text()
    failed = acceptance.ib_write_bw_run({"rc": 1, "stdout": failed_text, "stderr": ""}, "head", "worker1")
    assert failed["gbps"] is None and failed["error"].startswith("ib_write_bw exited 1: ")
    assert "Couldn't connect" in failed["error"]
    missing = acceptance.ib_write_bw_run(None, "head", "worker1", missing="ib_write_bw is not installed on head")
    assert missing["error"] == "ib_write_bw is not installed on head"
    skipped = acceptance.ib_write_bw_run({"skipped": True, "skip_reason": "Conditional result was False"}, "a", "b")
    assert skipped["error"] == "not run (Conditional result was False)"


def test_why_a_ring_pair_is_not_run():
    assert acceptance.ring_why_not("iperf3 is not installed on a", "b", "also missing", True) == \
        "iperf3 is not installed on a"
    assert acceptance.ring_why_not("", "b", "no fabric address on this node") == \
        "receiver b: no fabric address on this node"
    assert acceptance.ring_why_not("", "b", "", True) == "check mode: no traffic sent"
    assert acceptance.ring_why_not("", "b", "", False) == ""


def test_the_rdma_ring_skips_nodes_without_an_rdma_port():
    hostvars = {"head": {"__acceptance_rdma_device": "mlx5_0:1"}, "cpu1": {"__acceptance_rdma_device": ""},
                "gpu1": {"__acceptance_rdma_device": "mlx5_4:1"}, "gpu2": {}}
    hosts = ["head", "cpu1", "gpu1", "gpu2"]
    assert [acceptance.rdma_ring_next(h, hosts, hostvars) for h in hosts] == ["gpu1", "", "head", ""]
    assert acceptance.rdma_ring_next("head", ["head", "cpu1"], hostvars) == ""  # one RDMA node: no pair


def test_traffic_items_are_collected_from_hostvars_in_host_order():
    hostvars = {"a": {"__acceptance_traffic_items": [{"kind": "iperf3", "src": "a"}]}, "b": {},
                "c": {"__acceptance_traffic_items": {"kind": "iperf3", "src": "c"}}}
    assert [t["src"] for t in acceptance.acceptance_traffic(["c", "a", "b"], hostvars)] == ["c", "a"]


def test_extra_reported_versions_are_compared_too():
    nodes = healthy_cluster(3)
    for name in nodes:
        nodes[name]["versions"]["perftest"] = "4.5-0.20"
    nodes["worker2"]["versions"]["perftest"] = None
    nodes["worker2"]["versions"]["cupy"] = "13.3.0"
    report = acceptance.acceptance_report(nodes)
    assert report["lines"][2] == ("worker2: WARN cupy 13.3.0, others 13.4.1 (head, worker1); "
                                  "perftest none, others 4.5-0.20 (head, worker1)")


def test_ray_transfer_pairs_are_named_by_host_next_to_tcp():
    res = {"rc": 0, "stdout": "some ray log line\n" + (TRAFFIC / "ray_transfer.json").read_text(), "stderr": ""}
    hostvars = dict((h, {"ansible_facts": {"fabric": {"address": ip}}}) for h, ip in (
        ("head", "10.233.20.10"), ("worker1", "10.233.20.11"), ("worker2", "10.233.20.12")))
    tcp = [{"kind": "iperf3", "src": "head", "dst": "worker1", "gbps": 6.382}]
    items = acceptance.ray_transfer_items(res, ["head", "worker1", "worker2"], hostvars, tcp)
    assert [(i["src"], i["dst"]) for i in items] == [("head", "worker1"), ("worker1", "worker2"), ("worker2", "head")]
    assert items[0]["mb_per_s"] == 95.6 and items[0]["tcp_mb_per_s"] == 797.8 and items[0]["ratio"] == 0.12
    assert items[1]["ratio"] is None and items[2]["error"].startswith("GetTimeoutError")
    nodes = dict((h, record()) for h in ("head", "worker1", "worker2"))
    report = acceptance.acceptance_report(nodes, traffic=tcp + items)
    assert report["lines"][0].endswith("iperf3 to worker1 6.38 Gb/s, Ray object to worker1 95.6 MB/s "
                                       "(TCP 797.8 MB/s, ratio 0.12)")
    assert report["lines"][2] == "worker2: FAIL ray_object to head: GetTimeoutError: Get timed out: some object(s) not ready."


def test_ray_transfer_failure_is_a_readable_head_failure():
    items = acceptance.ray_transfer_items({"rc": 1, "stdout": "", "stderr": "Traceback...\nConnectionError: GCS at x"},
                                          ["head", "w1"], {})
    assert items == [{"kind": "ray_object", "src": "head", "dst": None, "mb_per_s": None,
                      "error": "ray_transfer.py failed (rc=1): ConnectionError: GCS at x"}]
    report = acceptance.acceptance_report({"head": record(), "w1": record()}, traffic=items)
    assert report["lines"][0] == "head: FAIL ray_object: ray_transfer.py failed (rc=1): ConnectionError: GCS at x"
    assert acceptance.ray_transfer_items({"skipped": True}, ["head"], {}) == []


# ---------------------------------------------------------------- NCCL

NCCL = REPO / "tests" / "fixtures" / "nccl"


def test_nccl_over_ib_with_gpudirect_rdma():
    transport = acceptance.nccl_transport((NCCL / "allreduce_ib.log").read_text())
    assert transport == {"network": "IB", "transport": "NET/IB", "gdrdma": True, "version": "2.21.5+cuda12.4",
                         "ib_devices": ["mlx5_%d:1" % i for i in range(8)]}
    assert acceptance.nccl_verdict(transport, rdma_fabric=True, host="dgx-a") is None


def test_nccl_socket_on_an_rdma_fabric_fails():
    transport = acceptance.nccl_transport((NCCL / "allreduce_socket.log").read_text())
    assert (transport["network"], transport["transport"], transport["gdrdma"]) == ("Socket", "NET/Socket", False)
    finding = acceptance.nccl_verdict(transport, rdma_fabric=True, host="dgx-a")
    assert finding["severity"] == "fail"
    assert finding["message"].startswith("NCCL chose NET/Socket on an RDMA fabric")
    # Without RDMA, sockets are all there is.
    assert acceptance.nccl_verdict(transport, rdma_fabric=False, host="dgx-a") is None


def test_nccl_ib_without_gdrdma_warns():
    transport = acceptance.nccl_transport((NCCL / "allreduce_ib_no_gdr.log").read_text())
    assert (transport["transport"], transport["gdrdma"], transport["ib_devices"]) == ("NET/IB", False, ["mlx5_0:1"])
    assert acceptance.nccl_verdict(transport, rdma_fabric=True, host="dgx-b")["severity"] == "warn"


def test_single_rank_proves_loading_only():
    transport = acceptance.nccl_transport((NCCL / "single_gpu.log").read_text())
    assert transport["transport"] is None and transport["version"] == "2.32.3+cuda12.9"
    assert acceptance.nccl_verdict(transport, rdma_fabric=True, host="gpu1", ranks=1) is None
    assert acceptance.nccl_verdict(transport, rdma_fabric=True, host="gpu1", ranks=2)["severity"] == "fail"


def test_busbw_follows_nccl_tests():
    # nccl-tests: 8 ranks, 1 GiB all-reduce in 12.5 ms -> algbw 85.899 GB/s, busbw = algbw * 2 * 7 / 8.
    assert acceptance.nccl_busbw(2**30, 0.0125, 8) == (85.899, 150.324)
    assert acceptance.nccl_busbw(2**30, 0.0125, 1) == (85.899, 0.0)
    with pytest.raises(ValueError):
        acceptance.nccl_busbw(2**30, 0, 8)


def test_the_gate_hands_over_only_the_hosts_it_left_out_with_their_reasons():
    gate = acceptance.FilterModule().filters()["acceptance_gate_left_out"]
    hostvars = {
        "head": {"acceptance_gate_left_out": False, "acceptance_gate_reasons": []},
        "w1": {"acceptance_gate_left_out": True, "acceptance_gate_reasons": ["0 GPU(s) on the PCI bus, 8 expected",
                                                                            "mlx5_3:1 (ib3) is DOWN"]},
        "w2": {},
    }
    assert gate(["head", "w1", "w2", "ghost"], hostvars) == {
        "w1": "acceptance gate: FAIL 0 GPU(s) on the PCI bus, 8 expected; mlx5_3:1 (ib3) is DOWN"}


def nccl_run(results, ranks=None, nbytes=2**28):
    """A registered result of roles/acceptance/files/ray_nccl.py with these per-rank results."""
    payload = {"ranks": ranks or len(results), "bytes": nbytes, "iters": 20, "results": results}
    return {"rc": 0, "stdout": "(ray's own log line)\n" + json.dumps(payload), "stderr": ""}


def rdma_hostvars(kind="infiniband"):
    return dict((h, {"ansible_facts": {"fabric": {"address": ip, "kind": kind}}}) for h, ip in (
        ("head", "10.0.0.1"), ("worker1", "10.0.0.2")))


def test_an_nccl_allreduce_through_ray_reports_busbw_and_the_transport_per_node():
    log = (NCCL / "allreduce_ib.log").read_text()
    res = nccl_run([{"ip": "10.0.0.1", "rank": 0, "seconds": 0.01, "sum_ok": True, "nccl_log": log},
                    {"ip": "10.0.0.2", "rank": 1, "seconds": 0.0125, "sum_ok": True, "nccl_log": log}])
    items = acceptance.nccl_allreduce_items(res, ["head", "worker1"], rdma_hostvars())
    assert [(i["src"], i["transport"], i["gdrdma"], i["busbw_gbs"]) for i in items] == [
        ("head", "NET/IB", True, 26.844), ("worker1", "NET/IB", True, 21.475)]
    report = acceptance.acceptance_report({"head": record(), "worker1": record()}, traffic=items)
    assert report["failed"] is False
    assert report["lines"][1].endswith(", NCCL all-reduce 2 rank(s) busbw 21.48 GB/s (algbw 21.48 GB/s) "
                                       "via NET/IB/GDRDMA")


def test_nccl_on_sockets_over_an_rdma_fabric_fails_the_node_with_the_reason():
    ib, socket = (NCCL / "allreduce_ib.log").read_text(), (NCCL / "allreduce_socket.log").read_text()
    res = nccl_run([{"ip": "10.0.0.1", "rank": 0, "seconds": 0.2, "sum_ok": True, "nccl_log": ib},
                    {"ip": "10.0.0.2", "rank": 1, "seconds": 0.2, "sum_ok": True, "nccl_log": socket}])
    items = acceptance.nccl_allreduce_items(res, ["head", "worker1"], rdma_hostvars())
    report = acceptance.acceptance_report({"head": record(), "worker1": record()}, traffic=items)
    assert report["nodes"]["head"]["verdict"] == "PASS"
    assert report["lines"][1].startswith("worker1: FAIL nccl: NCCL chose NET/Socket on an RDMA fabric")
    # On plain Ethernet, sockets are all NCCL has.
    items = acceptance.nccl_allreduce_items(res, ["head", "worker1"], rdma_hostvars("ethernet"))
    assert [i.get("error") for i in items] == [None, None]


def test_nccl_without_gpudirect_rdma_warns():
    log = (NCCL / "allreduce_ib_no_gdr.log").read_text()
    res = nccl_run([{"ip": "10.0.0.1", "rank": 0, "seconds": 0.05, "sum_ok": True, "nccl_log": log},
                    {"ip": "10.0.0.2", "rank": 1, "seconds": 0.05, "sum_ok": True, "nccl_log": log}])
    items = acceptance.nccl_allreduce_items(res, ["head", "worker1"], rdma_hostvars())
    report = acceptance.acceptance_report({"head": record(), "worker1": record()}, traffic=items)
    assert report["summary"] == {"PASS": 0, "WARN": 2, "FAIL": 0}
    assert "without GPUDirect RDMA" in report["lines"][0]


def test_a_rank_that_failed_or_hung_fails_its_own_node_and_a_wrong_sum_fails_too():
    res = nccl_run([{"ip": "10.0.0.1", "rank": 0, "error": "RuntimeError: CuPy is not in Ray's venv (No module "
                                                          "named 'cupy'). Fix: add cupy-cuda12x"},
                    {"ip": "10.0.0.2", "rank": 1, "error": "no answer in 300 s"}])
    items = acceptance.nccl_allreduce_items(res, ["head", "worker1"], rdma_hostvars())
    report = acceptance.acceptance_report({"head": record(), "worker1": record()}, traffic=items)
    assert report["lines"] == ["head: FAIL nccl: RuntimeError: CuPy is not in Ray's venv (No module named 'cupy'). "
                               "Fix: add cupy-cuda12x", "worker1: FAIL nccl: no answer in 300 s"]
    log = (NCCL / "allreduce_ib.log").read_text()
    res = nccl_run([{"ip": "10.0.0.1", "rank": 0, "seconds": 0.01, "sum_ok": False, "nccl_log": log}], ranks=2)
    items = acceptance.nccl_allreduce_items(res, ["head", "worker1"], rdma_hostvars())
    assert items[0]["error"] == "the all-reduce returned a wrong sum (expected 2 on every element)"


def test_one_gpu_node_proves_nccl_loads_and_no_gpu_is_a_note_not_a_failure():
    res = nccl_run([{"ip": "10.0.0.1", "rank": 0, "seconds": 0.001, "sum_ok": True,
                     "nccl_log": (NCCL / "single_gpu.log").read_text()}])
    items = acceptance.nccl_allreduce_items(res, ["head", "worker1"], rdma_hostvars())
    assert (items[0]["busbw_gbs"], items[0]["algbw_gbs"], items[0]["transport"], items[0].get("error")) == (
        None, None, None, None)
    report = acceptance.acceptance_report({"head": record(), "worker1": record()}, traffic=items)
    assert report["failed"] is False
    assert report["lines"][0].endswith("NCCL all-reduce on one rank: NCCL 2.32.3+cuda12.9 summed right on the GPU, "
                                       "no network used (a fabric figure needs two or more GPU nodes)")
    skipped = {"rc": 0, "stdout": json.dumps({"skipped": "no alive Ray node offers a GPU (Ray's GPU resource)"})}
    items = acceptance.nccl_allreduce_items(skipped, ["head", "worker1"], rdma_hostvars())
    report = acceptance.acceptance_report({"head": record(), "worker1": record()}, traffic=items)
    assert report["failed"] is False
    assert report["lines"][0].endswith("NCCL all-reduce not run: no alive Ray node offers a GPU (Ray's GPU resource)")


def test_an_nccl_script_that_crashed_is_a_readable_head_failure():
    items = acceptance.nccl_allreduce_items({"rc": 1, "stdout": "", "stderr": "Traceback...\nConnectionError: GCS"},
                                            ["head", "worker1"], rdma_hostvars())
    assert items == [{"kind": "nccl", "src": "head", "dst": None,
                      "error": "ray_nccl.py failed (rc=1): ConnectionError: GCS"}]
    assert acceptance.nccl_allreduce_items({"skipped": True}, ["head"], {}) == []
