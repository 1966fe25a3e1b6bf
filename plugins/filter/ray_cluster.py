"""Filters that present the ray_cluster fact (see plugins/modules/ray_cluster_facts.py)."""

from __future__ import annotations

GIB = float(2**30)

DOCUMENTATION_RAY_FABRIC_IPS = """
name: ray_fabric_ips
short_description: Map inventory hosts to the fabric IP their Ray node uses
description:
  - The one place that decides which IP a host's Ray node has, for expected_nodes.
  - ray_node_ip_address when set (the Ray role binds to it first), else the address the
    fabric_facts module found (ansible_facts['fabric']['address']). Hosts with neither are left out.
"""

DOCUMENTATION_RAY_SUMMARY_TABLE = """
name: ray_summary_table
short_description: Render the ray_cluster fact as a fixed-width table
description:
  - Returns a list of lines (for ansible.builtin.debug msg): a header, one row per Ray node
    (inventory host matched by IP, fabric IP, state, CPUs, GPUs, memory GiB, object store GiB),
    a row per expected host with no node (state MISSING), then TOTAL and AVAILABLE lines.
"""


def ray_fabric_ips(hosts, hostvars):
    """Return {inventory_hostname: fabric IP} for the hosts whose Ray IP is known.

    Order: the address the ray role bound Ray to (``__ray_node_ip``, set during
    a deploy), else ``ray_node_ip_address``, else the fabric role's address.
    """
    result = {}
    for host in hosts or []:
        hvars = hostvars[host] if host in hostvars else {}
        bound = hvars.get("__ray_node_ip") or ""
        explicit = hvars.get("ray_node_ip_address") or ""
        facts = hvars.get("ansible_facts") or {}
        fabric = facts.get("fabric") or {}
        address = str(bound) or str(explicit) or str(fabric.get("address") or "")
        if address:
            result[host] = address.split("/")[0]
    return result


def _num(value):
    if value is None:
        return "-"
    value = float(value)
    return "%d" % value if value == int(value) else "%.1f" % value


def _gib(value):
    return "-" if value is None else "%.1f" % (float(value) / GIB)


def _row(cells, widths):
    return "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()


def _figures(resources):
    resources = resources or {}
    return [_num(resources.get("CPU", 0)), _num(resources.get("GPU", 0)),
            _gib(resources.get("memory", 0)), _gib(resources.get("object_store_memory", 0))]


def ray_summary_table(facts, expected_nodes=None):
    """Return the cluster summary as a list of fixed-width lines."""
    facts = facts or {}
    expected = dict((str(ip), host) for host, ip in (expected_nodes or {}).items())
    header = ["HOST", "FABRIC IP", "STATE", "CPUS", "GPUS", "MEM GiB", "OBJ GiB"]
    rows = []
    seen_hosts = set()
    for node in facts.get("nodes") or []:
        host = expected.get(node.get("ip"), node.get("hostname") or "?")
        seen_hosts.add(host)
        state = (node.get("state") or "?") + (" (head)" if node.get("is_head") else "")
        rows.append([host, node.get("ip", "?"), state] + _figures(node.get("resources")))
    alive_hosts = set(expected.get(n.get("ip")) for n in facts.get("nodes") or [] if n.get("state") == "ALIVE")
    for host, ip in sorted((expected_nodes or {}).items()):
        if host not in alive_hosts and host not in seen_hosts:
            rows.append([host, ip, "MISSING", "-", "-", "-", "-"])
    rows.append(["TOTAL (%d alive)" % int(facts.get("nodes_alive") or 0), "", ""] + _figures(facts.get("totals")))
    rows.append(["AVAILABLE", "", ""] + _figures(facts.get("available")))
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    title = "Ray %s at %s: GCS %s, %d alive, %d dead" % (
        facts.get("ray_version", "?"), facts.get("address", "?"),
        "healthy" if facts.get("healthy") else "NOT healthy",
        int(facts.get("nodes_alive") or 0), int(facts.get("nodes_dead") or 0))
    lines = [title, _row(header, widths), _row(["-" * w for w in widths], widths)]
    lines += [_row(r, widths) for r in rows[:-2]]
    lines.append(_row(["-" * w for w in widths], widths))
    lines += [_row(r, widths) for r in rows[-2:]]
    missing = facts.get("missing") or []
    if missing:
        lines.append("Missing (no ALIVE Ray node at their fabric IP): " + ", ".join(missing))
    return lines


class FilterModule(object):
    """raymetal filters for the Ray cluster summary."""

    def filters(self):
        return {
            "ray_fabric_ips": ray_fabric_ips,
            "ray_summary_table": ray_summary_table,
        }
