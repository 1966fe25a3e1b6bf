"""The fabric facts of the recorded hosts under tests/fixtures/fabric, as fabric_facts would return them there.

One helper for the tests that need a real host's fabric facts without the host (nccl.conf, Ray's labels):
fabric_facts' own selection logic run on each recorded sysfs tree and its addresses.
"""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.raymetal.cluster.plugins.modules import fabric_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"


def facts_of(case, interface=None, require_rdma=True):
    """ansible_facts['fabric'] that fabric_facts would return on the recorded host ``case``."""
    live = json.loads((FIXTURES / case / "live.json").read_text())
    links = {}
    for name, cidrs in live["links"].items():
        links[name] = {"operstate": "up",
                       "ipv4": [(c.split("/")[0], int(c.split("/")[1])) for c in cidrs]}
    sysfs = str(FIXTURES / case / "sys")
    fact, _ = fabric_facts.choose(fabric_facts.read_netdevs(sysfs), fabric_facts.read_rdma_ports(sysfs), links,
                                  live["default"][0], interface=interface, require_rdma=require_rdma)
    return fact
