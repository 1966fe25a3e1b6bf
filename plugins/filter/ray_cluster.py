"""Filters that present the ray_cluster fact (see plugins/modules/ray_cluster_facts.py)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from ansible_collections.raymetal.cluster.plugins.plugin_utils.labels import PREFIX as LABEL_PREFIX
from ansible_collections.raymetal.cluster.plugins.plugin_utils.ssh_tunnel import tunnel_command

GIB = float(2**30)


def ray_fabric_ips(hosts, hostvars):
    """Return {inventory_hostname: fabric IP} for the hosts whose Ray IP is known.

    Order: the address the ray role bound Ray to (``ray_node_ip``, set during
    a deploy), else ``ray_node_ip_address``, else the fabric role's address.
    """
    result = {}
    for host in hosts or []:
        hvars = hostvars[host] if host in hostvars else {}
        bound = hvars.get("ray_node_ip") or ""
        explicit = hvars.get("ray_node_ip_address") or ""
        facts = hvars.get("ansible_facts") or {}
        fabric = facts.get("fabric") or {}
        address = str(bound) or str(explicit) or str(fabric.get("address") or "")
        if address:
            result[host] = address.split("/", 1)[0]
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


def _shown_labels(labels):
    """A node's labels as `key=value ...`: raymetal's (prefix left out), the site's own, and Ray's
    topology label ray.io/gpu-domain; Ray's other ray.io/ labels (node ID, ...) are left out."""
    shown = []
    for key, value in sorted((labels or {}).items()):
        if key.startswith(LABEL_PREFIX):
            key = key[len(LABEL_PREFIX):]
        elif key.startswith("ray.io/") and key != "ray.io/gpu-domain":
            continue
        shown.append("%s=%s" % (key, value))
    return " ".join(sorted(shown))


def _plural(count, one, many):
    return one if count == 1 else many


def ray_summary_table(facts, expected_nodes=None, hosts=None):
    """Return the cluster summary as a list of fixed-width lines.

    One row per Ray node in ``facts['nodes']`` (the current node of each IP),
    named by inventory host; a MISSING row for each inventory host with no node
    (``hosts`` without an entry in ``expected_nodes`` have no known fabric IP:
    their IP shows as ``?``). DEAD records of nodes that were replaced by a newer
    node at the same IP (``facts['earlier_nodes']``) get no row: one line counts
    them per host.
    """
    facts = facts or {}
    expected_nodes = dict(expected_nodes or {})
    expected = dict((str(ip), host) for host, ip in expected_nodes.items())
    header = ["HOST", "FABRIC IP", "STATE", "CPUS", "GPUS", "MEM GiB", "OBJ GiB"]
    rows = []
    seen_hosts = set()
    for node in facts.get("nodes") or []:
        host = expected.get(node.get("ip"), node.get("hostname") or "?")
        seen_hosts.add(host)
        state = (node.get("state") or "?") + (" (head)" if node.get("is_head") else "")
        rows.append([host, node.get("ip", "?"), state] + _figures(node.get("resources")))
    unknown = [h for h in (hosts or []) if h not in expected_nodes]
    for host, ip in sorted(list(expected_nodes.items()) + [(h, "?") for h in unknown]):
        if host not in seen_hosts:
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
    earlier = {}
    for node in facts.get("earlier_nodes") or []:
        host = expected.get(node.get("ip"), node.get("hostname") or node.get("ip") or "?")
        earlier[host] = earlier.get(host, 0) + 1
    for host in sorted(earlier):
        lines.append("%d earlier %s of %s %s dead (replaced by its current node; Ray keeps the record)" % (
            earlier[host], _plural(earlier[host], "node", "nodes"), host, _plural(earlier[host], "is", "are")))
    labelled = []
    for node in facts.get("nodes") or []:
        if node.get("state") != "ALIVE":
            continue
        shown = _shown_labels(node.get("labels"))
        if shown:
            labelled.append("  %s: %s" % (expected.get(node.get("ip"), node.get("hostname") or "?"), shown))
    if labelled:
        lines.append("Labels (%s keys without their prefix):" % LABEL_PREFIX)
        lines += labelled
    missing = sorted(set(facts.get("missing") or []) | set(unknown))
    if missing:
        lines.append("Missing (no ALIVE Ray node at their fabric IP): " + ", ".join(missing))
    return lines


def ray_not_alive(facts, hosts=None, expected_nodes=None):
    """Inventory hosts that are not an ALIVE Ray node: the module's ``missing``, plus
    every host in ``hosts`` whose fabric IP is unknown (not in ``expected_nodes``)."""
    facts = facts or {}
    known = expected_nodes or {}
    return sorted(set(facts.get("missing") or []) | set(h for h in (hosts or []) if h not in known))


def ray_access_lines(facts, ssh=None):
    """How to reach the dashboard and job API: from the head, and through an SSH tunnel.

    ``ssh`` describes how Ansible reaches the head: ``host``, ``user``, ``port``,
    ``key`` (private key file), ``common_args`` (ansible_ssh_common_args), ``cwd``
    (key paths under it are shown relative to it), ``token_file`` (controller copy of
    the token) and ``token_path`` (the token on the nodes).
    """
    facts = facts or {}
    ssh = ssh or {}
    address = str(facts.get("address") or "")
    try:
        split = urlsplit(address)
        ip, port = split.hostname, split.port
    except ValueError:
        ip = port = None
    if not ip or not port:
        return ["Dashboard and job API: %s (token required)" % (address or "?")]
    token_file = str(ssh.get("token_file") or "")
    if token_file:
        token_file = os.path.normpath(token_file)
        cwd = str(ssh.get("cwd") or "")
        if cwd and token_file.startswith(os.path.normpath(cwd) + os.sep):
            token_file = os.path.relpath(token_file, cwd)
    return [
        "Dashboard and job API: %s (token required)" % address,
        "  from a workstation: %s" % tunnel_command(ip, port, ssh),
        "  then: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=%s ray job submit --address http://127.0.0.1:%d -- python job.py"
        % (token_file or "<controller copy of the token>", port),
        "  on a node: set -a; . /etc/ray/ray.env; set +a; ray job submit --address %s -- python job.py" % address,
        "Auth token: %s on every node (mode 0600, user ray); controller copy: %s" % (
            ssh.get("token_path") or "?", token_file or "?"),
    ]


class FilterModule(object):
    """raymetal filters for the Ray cluster summary."""

    def filters(self):
        return {
            "ray_fabric_ips": ray_fabric_ips,
            "ray_summary_table": ray_summary_table,
            "ray_not_alive": ray_not_alive,
            "ray_access_lines": ray_access_lines,
        }
