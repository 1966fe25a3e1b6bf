"""playbooks/status.yml and the deploy summary on the lab: exit status, one row per host, the table.

A worker's Ray unit is stopped: status names it and exits 2 (0 with
raymetal_status_report_only). site.yml then starts it again: it comes back as
a new Ray node at the same IP while the GCS keeps the old one as DEAD, and
both the deploy summary and status show that host once, ALIVE, with the old
record counted on a line of its own. The Python API still returns the report
(with earlier_nodes) through set_stats.
"""

from __future__ import annotations

import re

from raymetal.runner import RaymetalError, status
from tests.lab import labkit

# On the first lab of `make e2e` (tools/e2e.sh): its summaries count every dead node of the GCS, and on lab 2 the
# scale-out test leaves the record of a worker the lab no longer has ("3 alive, 1 dead"; run35).
E2E_LAB = 1

WORKER = f"{labkit.LAB_PREFIX}-worker2"
FAIL_TASK = "Fail when an inventory host is not an alive Ray node"


def summary(output: str) -> list[str]:
    """The lines of the summary message as printed (the block under `msg: |-`)."""
    start = output.index("TASK [ray : Show the Ray cluster summary]")
    lines = output[start:].splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() == "msg: |-")
    block = []
    for line in lines[first + 1:]:
        if not line.startswith("        "):
            break
        block.append(line[8:])
    return block


def rows(block: list[str], lab) -> dict[str, list[list[str]]]:
    found = {}
    for line in block:
        cells = line.split()
        if cells and cells[0] in lab:
            found.setdefault(cells[0], []).append(cells)
    return found


def flat(output: str) -> str:
    """Ansible's YAML callback wraps long messages: compare with whitespace runs as one space."""
    return " ".join(output.split())


def status_playbook(*args):
    return labkit.run_playbook("playbooks/status.yml", labkit.LAB_INVENTORY, *args, timeout=600)


def test_status_prints_one_table_and_exits_0_when_all_alive(cluster, lab):
    rc, out, _ = status_playbook()
    assert rc == 0, out
    block = summary(out)
    assert block[0].endswith(f"GCS healthy, {len(lab)} alive, 0 dead"), block
    assert block[1].split()[:3] == ["HOST", "FABRIC", "IP"]
    assert {h: len(r) for h, r in rows(block, lab).items()} == {h: 1 for h in lab}
    assert not re.search(r"^\s+- ['\"]", out, re.M), "summary printed as a quoted YAML list"
    tunnel = next(line for line in block if "from a workstation:" in line)
    head = next(h for h, v in lab.items() if v["group"] == "ray_head")
    assert f"-i {labkit.LAB_KEY.relative_to(labkit.ROOT)} " in tunnel and tunnel.endswith(f"root@{lab[head]['ansible_host']}")
    assert FAIL_TASK not in out or "skipping: [" in out.split(FAIL_TASK)[1][:400]


def earlier_count(facts) -> int:
    return sum(1 for n in facts["earlier_nodes"] if n["hostname"] == WORKER)


def test_a_worker_the_acceptance_gate_leaves_out_fails_status_and_after_site_yml_is_one_alive_row(cluster, lab,
                                                                                                   tmp_path):
    """A deploy with the acceptance gate on, where the worker is expected to have a GPU it lacks: its node checks
    FAIL before Ray starts, so the deploy stops Ray there, names it with the reason and succeeds for the rest.
    Then status fails on the missing node, and a plain site.yml brings it back."""
    # Earlier tests may have restarted this worker already: count from here.
    before = earlier_count(status(str(labkit.LAB_INVENTORY)))
    others = [h for h in lab if h != WORKER]
    units = labkit.invocation_ids(lab, others)
    inv = labkit.inventory_copy(tmp_path, {WORKER: {"acceptance_expected_gpus": 1}})
    rc, out, stats = labkit.run_playbook("site.yml", inv, "-e", "acceptance_gate=true")
    try:
        assert rc == 0, out[-4000:]
        assert "Left out of the cluster by this run (not converged, not waited for):" in out, out[-4000:]
        assert f"{WORKER}: acceptance gate: FAIL 0 GPU(s) on the PCI bus, 1 expected" in flat(out), out[-4000:]
        assert labkit.sh(WORKER, "systemctl is-active ray-worker", check=False).stdout.strip() == "inactive"
        assert labkit.invocation_ids(lab, others) == units  # the others were neither restarted nor changed
        assert all(stats[h]["changed"] == 0 for h in others), stats
        labkit.wait_until(lambda: status(str(labkit.LAB_INVENTORY))["missing"] == [WORKER], 120, interval=5,
                          what=f"status to see {WORKER} missing")
        rc, out, _ = status_playbook()
        assert rc == 2, out
        assert f"TASK [{FAIL_TASK}]" in out
        assert f"not an ALIVE Ray node: {WORKER}." in flat(out)
        assert rows(summary(out), lab)[WORKER][0][2] == "DEAD"
        rc, out, _ = status_playbook("-e", "raymetal_status_report_only=true")
        assert rc == 0, out
        assert f"Missing (no ALIVE Ray node at their fabric IP): {WORKER}" in summary(out)
        try:
            status(str(labkit.LAB_INVENTORY), require_all_alive=True)
            raise AssertionError("status(require_all_alive=True) did not raise with a worker down")
        except RaymetalError as err:
            assert err.rc == 2 and WORKER in err.failures[0]["msg"]
    finally:
        # As a user would: rerun the deploy, which starts the stopped unit again.
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, timeout=900)
    assert rc == 0, out
    after = before + 1
    earlier_line = (f"{after} earlier node{'s' if after > 1 else ''} of {WORKER} {'are' if after > 1 else 'is'} dead "
                    "(replaced by its current node; Ray keeps the record)")
    for name, output in (("site.yml", out), ("status.yml", status_playbook()[1])):
        block = summary(output)
        assert block[0].endswith(f"{len(lab)} alive, 0 dead"), (name, block)
        found = rows(block, lab)
        assert {h: len(r) for h, r in found.items()} == {h: 1 for h in lab}, (name, block)
        assert found[WORKER][0][2] == "ALIVE", (name, block)
        assert earlier_line in block, (name, block)
    facts = status(str(labkit.LAB_INVENTORY))
    assert [n["hostname"] for n in facts["nodes"]].count(WORKER) == 1
    assert facts["missing"] == [] and facts["nodes_dead"] == 0
    assert earlier_count(facts) == after
    assert all(n["state"] == "DEAD" for n in facts["earlier_nodes"])
