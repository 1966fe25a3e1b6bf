"""playbooks/acceptance.yml on the deployed lab: verdicts, report, iperf3 ring, drift, no changes.

The lab has no GPU and no RDMA: the node checks find neither (and say so), the iperf3 ring runs
for real over ib0 (iperf3 installed from the lab's apt mirror), and drift is made real by
installing two versions of a tiny package built on the nodes.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from raymetal.runner import AcceptanceFailed, acceptance
from tests.lab import labkit

PLAYBOOK = "playbooks/acceptance.yml"
PROBE = "raymetal-drift-probe"


def ray_unit(name: str) -> str:
    return "ray-head" if name.endswith("-head") else "ray-worker"


def ray_pids(lab) -> dict[str, str]:
    """MainPID and start time of each node's Ray unit (a restart changes both)."""
    pids = {}
    for name in lab:
        out = labkit.sh(name, "systemctl show -p MainPID -p ActiveEnterTimestampMonotonic %s" % ray_unit(name)).stdout
        pids[name] = out.strip()
        assert "MainPID=0" not in out, (name, out)
    return pids


def verdict_lines(output: str) -> dict[str, str]:
    """host -> the verdict line ansible printed (a line that YAML folded onto the next ones, as a long host
    list on a lab with a long prefix is, joined again)."""
    lines = {}
    start = re.compile(r"^(\s+)- '?(%s-[a-z0-9]+): (PASS|WARN|FAIL)(.*)$" % re.escape(labkit.LAB_PREFIX))
    text = output.splitlines()
    for i, line in enumerate(text):
        match = start.match(line)
        if not match:
            continue
        rest = [match.group(4)]
        for more in text[i + 1:]:
            # A folded scalar goes on, indented deeper than its "- ", up to the next item or the end of the list.
            if not more.startswith(match.group(1) + "  ") or more.lstrip().startswith("- "):
                break
            rest.append(more.strip())
        value = " ".join(part.strip() for part in rest if part.strip())
        if value.endswith("'"):
            value = value[:-1]
        lines[match.group(2)] = ("%s %s" % (match.group(3), value)).strip()
    return lines


@pytest.fixture(scope="module")
def first_report(cluster):
    """The module's first acceptance run (through the Python API): it may install iperf3 on the nodes."""
    return acceptance(str(labkit.LAB_INVENTORY))


def test_healthy_lab_passes_with_a_json_report_and_iperf3_figures(first_report, lab):
    report = first_report
    assert report["failed"] is False, report["lines"]
    assert report["summary"]["FAIL"] == 0 and report["summary"]["PASS"] == len(lab), report["lines"]
    for name in lab:
        node = report["nodes"][name]
        assert node["verdict"] == "PASS", report["lines"]
        assert node["versions"]["ray"] == "2.60.0" and node["versions"]["nccl"] == "2.32.3"
        assert node["versions"]["rdma-core"], node["versions"]
        assert "no RDMA ports, no GPUs" in node["figures"]
    # The rings: every node sent once and received once, over the fabric, with iperf3 and through Ray.
    for kind in ("iperf3", "ray_object"):
        traffic = [t for t in report["traffic"] if t["kind"] == kind]
        assert sorted(t["src"] for t in traffic) == sorted(lab) and sorted(t["dst"] for t in traffic) == sorted(lab)
    # NCCL through Ray: the script ran through Ray on the head and found no node that offers a GPU.
    nccl = [t for t in report["traffic"] if t["kind"] == "nccl"]
    note = "NCCL all-reduce not run: no alive Ray node offers a GPU (Ray's GPU resource)"
    assert nccl == [{"kind": "nccl", "src": labkit.HEAD, "dst": None, "note": note}], nccl
    assert report["nodes"][labkit.HEAD]["figures"].endswith(note)
    # The shared storage (inventory/lab mounts the lab's shared directory): every node wrote, read back the next
    # node's file (its digest matched) and saw every node's file.
    storage = [t for t in report["traffic"] if t["kind"] == "storage"]
    assert sorted(t["src"] for t in storage) == sorted(lab) and sorted(t["peer"] for t in storage) == sorted(lab)
    for name in lab:
        entry = report["nodes"][name]["storage"]
        assert entry["path"] == "/mnt/ray-shared" and entry["error"] is None, entry
        # The lab's floor (inventory/lab: the path works, not how fast the VM's shared disk is under the suite).
        assert entry["floor_mb_per_s"] == 1.0, entry
        assert entry["write_mb_per_s"] > 1.0 and entry["read_mb_per_s"] > 1.0, entry
        assert re.search(r"storage write [0-9.]+ MB/s, read [0-9.]+ MB/s \(%s's file\)" % re.escape(entry["peer"]),
                         report["nodes"][name]["figures"]), report["nodes"][name]["figures"]
    for item in report["traffic"]:
        if item["kind"] in ("nccl", "storage"):
            continue
        assert item["error"] is None, item
        figures = report["nodes"][item["src"]]["figures"]
        if item["kind"] == "iperf3":
            assert item["gbps"] > 0.2, item
            assert re.search(r"iperf3 to %s [0-9.]+ Gb/s" % re.escape(item["dst"]), figures)
        else:
            assert item["bytes"] == 64 * 2**20 and item["mb_per_s"] > 0 and item["ratio"] > 0, item
            assert re.search(r"Ray object to %s [0-9.]+ MB/s \(TCP [0-9.]+ MB/s, ratio [0-9.]+\)" % re.escape(item["dst"]),
                             figures)
    saved = Path(report["report_path"])
    assert saved.parent == labkit.LAB_INVENTORY / "acceptance"
    assert json.loads(saved.read_text())["nodes"].keys() == report["nodes"].keys()


def test_acceptance_changes_nothing_on_the_nodes(first_report, lab):
    # After the module's first run (which may have installed iperf3), a run changes nothing and restarts no Ray.
    before = ray_pids(lab)
    rc, out, recap = labkit.run_playbook(PLAYBOOK, labkit.LAB_INVENTORY)
    assert rc == 0, out[-3000:]
    for name in lab:
        assert recap[name]["changed"] == 0, (name, recap[name])
        assert recap[name]["failed"] == 0
    assert ray_pids(lab) == before
    lines = verdict_lines(out)
    assert set(lines) == set(lab), out[-3000:]
    assert all(line.startswith("PASS ") for line in lines.values()), lines


@pytest.fixture
def drift_probe(lab):
    """A tiny package, version 1.0 on every node but the last worker, which gets 2.0; removed afterwards."""
    odd = sorted(lab)[-1]
    build = textwrap.dedent("""
        set -e
        d=$(mktemp -d); mkdir -p $d/DEBIAN
        printf 'Package: %s\\nVersion: %%s\\nArchitecture: all\\nMaintainer: raymetal tests\\nDescription: drift probe\\n' > $d/DEBIAN/control
        dpkg-deb -b $d /tmp/probe.deb >/dev/null && dpkg -i /tmp/probe.deb >/dev/null && rm -rf $d /tmp/probe.deb
    """) % PROBE
    for name in lab:
        labkit.sh(name, build % ("2.0" if name == odd else "1.0"))
    yield odd
    for name in lab:
        labkit.sh(name, "dpkg -r %s >/dev/null" % PROBE, check=False)


# The drift check alone: the traffic between the nodes (iperf3, Ray's object transfer, the shared storage) is
# test_healthy_lab_passes_with_a_json_report_and_iperf3_figures's, and adds nothing to what drift proves.
NODE_CHECKS_ONLY = {"acceptance_traffic": False, "acceptance_ray_object": False, "acceptance_storage": False}


def test_drift_is_named_and_fails_when_configured(cluster, lab, drift_probe):
    others = ", ".join(sorted(n for n in lab if n != drift_probe))
    packages = json.dumps({"acceptance_packages": ["rdma-core", PROBE], **NODE_CHECKS_ONLY})
    rc, out, _ = labkit.run_playbook(PLAYBOOK, labkit.LAB_INVENTORY, "-e", packages)
    assert rc == 0, out[-3000:]
    lines = verdict_lines(out)
    assert lines[drift_probe] == "WARN %s 2.0, others 1.0 (%s)" % (PROBE, others)
    assert all(lines[n].startswith("PASS ") for n in lab if n != drift_probe), lines

    strict = json.dumps({"acceptance_packages": ["rdma-core", PROBE], "acceptance_drift_fail": [PROBE, "ray"],
                         **NODE_CHECKS_ONLY})
    with pytest.raises(AcceptanceFailed) as err:
        acceptance(str(labkit.LAB_INVENTORY), extravars=json.loads(strict))
    report = err.value.report
    assert report["nodes"][drift_probe]["verdict"] == "FAIL"
    assert report["drift"] == [{"key": PROBE, "host": drift_probe, "value": "2.0", "expected": "1.0",
                                "against": "majority"}]
    assert "%s: FAIL %s 2.0, others 1.0" % (drift_probe, PROBE) in str(err.value)


TRAFFIC = labkit.ROOT / "tests" / "fixtures" / "traffic"
# Not under /tmp: Debian 13 mounts a tmpfs there, which hides what `docker cp` writes.
FAKE_SYS = "/var/tmp/raymetal-fake-sys"


@pytest.fixture
def fake_rdma(lab):
    """Every node looks like a DGX H100 to the node checks (the recorded sysfs tree, whose ib0 sits on mlx5_0:1)
    and has a stand-in ib_write_bw that keeps perftest's command line and TCP handshake; removed afterwards."""
    tree = labkit.ROOT / "tests" / "fixtures" / "fabric" / "dgx_h100" / "sys"
    for name in lab:
        labkit.sh(name, f"rm -rf {FAKE_SYS} && mkdir -p /usr/local/share/raymetal-test")
        for src, dst in ((tree, FAKE_SYS), (TRAFFIC / "fake_ib_write_bw.py", "/usr/local/bin/ib_write_bw"),
                         (TRAFFIC / "ib_write_bw_gbits.txt", "/usr/local/share/raymetal-test/ib_write_bw_gbits.txt")):
            subprocess.run(["docker", "cp", "-L", str(src), f"{name}:{dst}"], check=True, capture_output=True)
    yield
    for name in lab:
        labkit.sh(name, f"rm -rf {FAKE_SYS} /usr/local/bin/ib_write_bw /usr/local/share/raymetal-test", check=False)


def test_the_rdma_ring_runs_ib_write_bw_between_the_fabric_ports(cluster, lab, fake_rdma):
    """The ib_write_bw ring, run for real between the lab nodes' fabric addresses with a stand-in binary (the lab
    has no RDMA): each node's server starts on the port behind ib0 (mlx5_0:1 in the recorded tree), each node
    sends to the next once, and the figure is judged against 0.9 of the port's 400 Gb/s. The checks that go through
    Ray (the object ring, NCCL) and the storage ring are off: the module's first run proves them, and this run
    only the ib_write_bw ring, which runs with the rest of the traffic checks (acceptance_traffic)."""
    extra = {"acceptance_sysfs_root": FAKE_SYS, "acceptance_state_file": "", "acceptance_rdma_tools": [],
             "acceptance_ray_object": False, "acceptance_nccl_allreduce": False, "acceptance_storage": False,
             "acceptance_fail_on_fail": False}
    report = acceptance(str(labkit.LAB_INVENTORY), extravars=extra)
    rdma = [t for t in report["traffic"] if t["kind"] == "ib_write_bw"]
    assert sorted(t["src"] for t in rdma) == sorted(lab) and sorted(t["dst"] for t in rdma) == sorted(lab), rdma
    for item in rdma:
        assert item["error"] is None and item["gbps"] == 391.84 and item["threshold_gbps"] == 360.0, item
        assert f"ib_write_bw to {item['dst']} 391.84 Gb/s" in report["nodes"][item["src"]]["figures"], report["lines"]
