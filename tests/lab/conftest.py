"""Fixtures for the lab end-to-end tests. `make e2e` brings the labs up first.

`make e2e` runs the lab tests on E2E_LABS labs side by side (tools/e2e.sh): each
lab is its own set of containers, subnets and inventory, and a pytest run of its
own. A test module says which lab it prefers with E2E_LAB = N (default 1, the
built-in lab, inventory/lab); with fewer labs it runs on lab ((N - 1) % labs) + 1.
RAYMETAL_E2E_LAB=i/n (set by tools/e2e.sh) keeps the modules of lab i; without
it every module runs, on whatever lab LAB_PREFIX names.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shlex
import subprocess
import time

import pytest

from tests.lab import labkit


def lab_of(module, labs: int) -> int:
    """The lab (1..labs) that a test module runs on."""
    return (int(getattr(module, "E2E_LAB", 1)) - 1) % labs + 1


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.lab)
    shard = os.environ.get("RAYMETAL_E2E_LAB")
    if not shard:
        return
    mine, labs = (int(part) for part in shard.split("/"))
    keep = [item for item in items if lab_of(item.module, labs) == mine]
    deselected = [item for item in items if lab_of(item.module, labs) != mine]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = keep


@pytest.fixture(scope="session")
def lab():
    """The running lab's hosts; fails clearly if the lab is not up."""
    if not (labkit.LAB_INVENTORY / "hosts.yml").exists():
        pytest.fail(f"the lab {labkit.LAB_PREFIX} is not up: run `make lab-up` (or `make e2e`, which does it)")
    return labkit.lab_hosts()


@pytest.fixture(scope="session")
def cluster(lab):
    """Deploy site.yml on the lab once (through ansible-runner); the ray_cluster facts."""
    from raymetal.runner import deploy

    with _cost("the session's first deploy (the cluster fixture)"):
        facts = deploy(str(labkit.LAB_INVENTORY))
    assert facts["nodes_alive"] == len(lab), facts
    return facts


@pytest.fixture(scope="session")
def full_rerun(cluster, lab):
    """site.yml again with every task while a job runs, once per session (labkit.full_rerun): the rerun that
    test_ray_cluster.py reads for Ray's nodes, units and the job, and test_monitoring.py for Prometheus and
    node_exporter. One full-path run on three nodes costs about 40 CPU-seconds; both proofs read the same one."""
    return labkit.full_rerun(lab)


# --- No false quarantine (issue 36) ---------------------------------------------------------------------------------
# The lab's inventory runs the node health loop on every node for the whole session (health_enabled in
# inventory/lab/group_vars). A test that makes faults the loop should see asks for health_faults, which notes when it
# ran. At the end of the session every node's loop is read: a quarantine or a sick head outside those windows (its
# journal, this boot), or a quarantine record still held (its state file, which survives the lab's reboots), fails the
# session with the node, the time and the loop's own line.
_FAULT_WINDOWS: list[tuple[float, float]] = []


@pytest.fixture
def health_faults():
    """Declares that this test makes faults the health loop should act on (quarantines are expected meanwhile)."""
    start = time.time()
    try:
        yield
    finally:
        _FAULT_WINDOWS.append((start, time.time()))


@pytest.fixture(scope="session", autouse=True)
def _no_false_quarantine():
    start = time.time()
    yield
    if not (labkit.LAB_INVENTORY / "hosts.yml").exists():
        return
    found = labkit.false_quarantines(labkit.lab_hosts(), start, _FAULT_WINDOWS)
    assert found == [], ("the health loop quarantined a node no test made sick (or still holds one):\n"
                         + "\n".join(found))


# --- What each test costs (tools/e2e.sh sets RAYMETAL_TEST_COST to a file) ------------------------------------------
# One line per test: its wall time, the CPU of what it ran on the controller (ansible-playbook and every other child
# this pytest process waited for), and the CPU of this lab's containers (their cgroups). The machine running the
# suite is CPU-bound, so this, not wall time, says which proof is expensive. tools/suite_report.py prints the sum.
def _lab_containers_cpu() -> dict[str, float]:
    """CPU seconds of each running container of this lab, by container ID (a container's cgroup counts from its start)."""
    ids = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", f"label=io.raymetal.lab={labkit.LAB_PREFIX}"],
                         capture_output=True, text=True, check=False).stdout.split()
    usage = {}
    for cid in ids:
        for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage", 1e-9),
                            (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat", 1e-6)):
            try:
                text = open(path).read()
            except OSError:
                continue
            value = text.split()[1] if text.startswith("usage_usec") else text.split()[0]
            usage[cid] = int(value) * scale
            break
    return usage


def _nodes_cpu_between(before: dict[str, float], after: dict[str, float]) -> float:
    """What the lab's containers spent between two samples. A container the test stopped and started (or restarted)
    has a new cgroup whose counter starts at 0: its CPU since that start is counted (what it spent before the stop
    is lost, so the figure is a lower bound for such a test)."""
    return sum(now - before[cid] if now >= before.get(cid, now + 1) else now for cid, now in after.items())


class _Measure:
    """Wall time, the controller's CPU (this process's waited-for children) and the lab containers' CPU, from its
    creation to done()."""

    def __init__(self):
        self.start, self.nodes = time.monotonic(), _lab_containers_cpu()
        self.children = resource.getrusage(resource.RUSAGE_CHILDREN)

    def done(self) -> str:
        """'wall<TAB>controller<TAB>nodes', seconds."""
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        controller = (after.ru_utime + after.ru_stime) - (self.children.ru_utime + self.children.ru_stime)
        return (f"{time.monotonic() - self.start:.1f}\t{controller:.1f}\t"
                f"{_nodes_cpu_between(self.nodes, _lab_containers_cpu()):.1f}")


@contextlib.contextmanager
def _cost(name: str):
    path = os.environ.get("RAYMETAL_TEST_COST")
    if not path:
        yield
        return
    measure = _Measure()
    try:
        yield
    finally:
        with open(path, "a") as out:
            out.write(f"{name}\t{measure.done()}\n")


@pytest.fixture(autouse=True)
def _test_cost(request):
    with _cost(request.node.nodeid):
        yield


# One line per playbook run (labkit.run_playbook and raymetal.runner both call ansible_runner.run): the test, the
# playbook, its options (extra variables by name only, never their values), wall seconds, controller and node CPU,
# and the ok and changed task-host pairs (a fast-path run has few). Written beside RAYMETAL_TEST_COST's file as
# playbooks-labN.tsv; tools/suite_report.py prints the runs that cost the most. Which runs a faster suite should
# share or send down the fast path is read there.
def _run_options(kwargs: dict) -> str:
    words = shlex.split(kwargs.get("cmdline") or "")
    names = sorted((kwargs.get("extravars") or {}).keys())
    for before, word in zip(words, words[1:]):
        if before not in ("-e", "--extra-vars"):
            continue
        try:
            value = json.loads(word)
        except ValueError:
            value = None
        if isinstance(value, dict):
            names += sorted(value)
        else:
            names += ["@file"] if word.startswith("@") else [pair.split("=", 1)[0] if "=" in pair else "?"
                                                                    for pair in word.split()]
    flags = [w for w in words if w.startswith("-") and w not in ("-e", "--extra-vars")]
    return " ".join(flags + ([f"-e {','.join(names)}"] if names else []))


@pytest.fixture(scope="session", autouse=True)
def _playbook_costs():
    cost = os.environ.get("RAYMETAL_TEST_COST")
    if not cost:
        yield
        return
    import ansible_runner

    path = os.path.join(os.path.dirname(cost), os.path.basename(cost).replace("cost-", "playbooks-", 1))
    real_run = ansible_runner.run

    def measured_run(**kwargs):
        measure = _Measure()
        result = real_run(**kwargs)
        figures = measure.done()
        stats = getattr(result, "stats", None) or {}
        # "<nodeid> (setup)" while a fixture runs it (the session's first deploy: before the first test).
        test, _, phase = os.environ.get("PYTEST_CURRENT_TEST", "? (session)").replace("tests/lab/", "").partition(" ")
        test += "" if phase == "(call)" else f" {phase}"
        with open(path, "a") as out:
            out.write(f"{test}\t{os.path.basename(str(kwargs.get('playbook', '')))}\t{_run_options(kwargs)}\t"
                      f"{figures}\t{sum((stats.get('ok') or {}).values())}\t{sum((stats.get('changed') or {}).values())}\n")
        return result

    ansible_runner.run = measured_run
    try:
        yield
    finally:
        ansible_runner.run = real_run
