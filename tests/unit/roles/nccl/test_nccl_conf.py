"""roles/nccl/templates/nccl.conf.j2 rendered from the fabric facts of recorded hosts.

The facts come from the fabric_facts module's own selection logic run on the recorded sysfs trees and
addresses under tests/fixtures/fabric (a DGX with four IPoIB rails and RoCE, a RoCE-only host, a host without
RDMA), so the RDMA branch of nccl.conf, which the lab cannot reach (no HCA), is checked against what a real
host's facts would produce. The template is rendered the way Ansible's template module renders it
(trim_blocks).
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from recorded_fabric import facts_of

REPO = Path(__file__).resolve().parents[4]
FIXTURES = REPO / "tests" / "fixtures" / "fabric"
TEMPLATE = REPO / "roles" / "nccl" / "templates" / "nccl.conf.j2"


def render(fabric, extra_env=None):
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    text = env.from_string(TEMPLATE.read_text()).render(
        ansible_managed="Ansible managed", __nccl_fabric=fabric, nccl_extra_env=extra_env or {})
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_dgx_infiniband_enables_ib_on_the_active_hcas():
    fabric = facts_of("dgx")
    assert fabric["kind"] == "infiniband"
    lines = render(fabric)
    assert lines[0] == "NCCL_SOCKET_IFNAME==" + fabric["interface"]
    assert "NCCL_IB_DISABLE=0" in lines
    hca = [line for line in lines if line.startswith("NCCL_IB_HCA=")]
    # exact-match list (leading '='), every active InfiniBand HCA, and nothing else
    assert hca == ["NCCL_IB_HCA==" + ",".join(fabric["hcas"])]
    assert fabric["hcas"] and all(name.startswith("mlx5_") for name in fabric["hcas"])


def test_roce_enables_ib_verbs_on_the_roce_hca():
    fabric = facts_of("roce")
    assert fabric["kind"] == "roce"
    lines = render(fabric)
    assert "NCCL_IB_DISABLE=0" in lines
    assert "NCCL_SOCKET_IFNAME==" + fabric["interface"] in lines
    assert "NCCL_IB_HCA==" + ",".join(fabric["hcas"]) in lines


def test_plain_ethernet_disables_ib_and_names_no_hca():
    fabric = facts_of("nordma", require_rdma=False)
    lines = render(fabric)
    assert "NCCL_IB_DISABLE=1" in lines
    assert not [line for line in lines if line.startswith("NCCL_IB_HCA")]


@pytest.mark.parametrize("key,value", [("NCCL_SOCKET_IFNAME", "=ib1"), ("NCCL_IB_HCA", "=mlx5_0:1"),
                                       ("NCCL_IB_DISABLE", "1")])
def test_an_override_replaces_the_derived_value_once(key, value):
    lines = render(facts_of("dgx"), {key: value, "NCCL_DEBUG": "WARN"})
    assert [line for line in lines if line.startswith(key + "=")] == [f"{key}={value}"]
    assert "NCCL_DEBUG=WARN" in lines
