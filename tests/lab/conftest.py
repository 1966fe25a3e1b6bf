"""Fixtures for the lab end-to-end tests. `make e2e` brings the lab up first."""

from __future__ import annotations

import pytest

from tests.lab import labkit


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def lab():
    """The running lab's hosts; fails clearly if the lab is not up."""
    if not (labkit.LAB_INVENTORY / "hosts.yml").exists():
        pytest.fail("the lab is not up: run `make lab-up` (or `make e2e`, which does it)")
    return labkit.lab_hosts()


@pytest.fixture(scope="session")
def cluster(lab):
    """Deploy site.yml on the lab once (through ansible-runner); the ray_cluster facts."""
    from raymetal.runner import deploy

    facts = deploy(str(labkit.LAB_INVENTORY))
    assert facts["nodes_alive"] == len(lab), facts
    return facts
