"""Fixtures for the lab end-to-end tests. `make e2e` brings the labs up first.

`make e2e` runs the lab tests on E2E_LABS labs side by side (tools/e2e.sh): each
lab is its own set of containers, subnets and inventory, and a pytest run of its
own. A test module says which lab it prefers with E2E_LAB = N (default 1, the
built-in lab, inventory/lab); with fewer labs it runs on lab ((N - 1) % labs) + 1.
RAYMETAL_E2E_LAB=i/n (set by tools/e2e.sh) keeps the modules of lab i; without
it every module runs, on whatever lab LAB_PREFIX names.
"""

from __future__ import annotations

import os

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

    facts = deploy(str(labkit.LAB_INVENTORY))
    assert facts["nodes_alive"] == len(lab), facts
    return facts
