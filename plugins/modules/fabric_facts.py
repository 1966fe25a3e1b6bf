#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""Detect the node's RDMA fabric interface (InfiniBand, RoCE, Omni-Path)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_facts
short_description: Detect the fabric interface (IPoIB, RoCE, Omni-Path) of a node
version_added: "0.1.0"
description:
  - Reads C(/sys/class/net) and C(/sys/class/infiniband) to find the RDMA
    devices of a node, their ports, and the network interfaces bound to them.
  - Takes IPv4 addresses and the default route from the live system
    (C(ip -j addr), C(ip -j route)), never from O(sysfs_root).
  - "Chooses the interface in this order: the explicit O(interface); else the
    first active IPoIB interface (link type 32, which includes Omni-Path) with
    an IPv4 address, by name; else the first active RoCE interface (an
    Ethernet interface bound to an RDMA port whose link layer is Ethernet)
    with an IPv4 address; else, only when O(require_rdma=false), the
    default-route interface, with a warning."
  - Returns the result as the C(fabric) fact.
options:
  interface:
    description:
      - Use this interface instead of detecting one.
      - It must exist on the node and carry an IPv4 address, otherwise the
        module fails and lists the interfaces that exist.
      - With O(require_rdma=true) it must also be an IPoIB or RoCE interface.
    type: str
    required: false
  require_rdma:
    description:
      - When true, fail (listing every candidate and why it was rejected) if
        no InfiniBand or RoCE interface with an IPv4 address is usable,
        instead of falling back to the default-route interface.
    type: bool
    default: true
  sysfs_root:
    description:
      - Root of the sysfs tree to read. Change it only for tests.
    type: path
    default: /sys
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - raymetal.cluster.attributes
  - raymetal.cluster.attributes.facts
notes:
  - Needs the C(ip) command from iproute2 with JSON output (C(-j)).
  - Reads nothing but sysfs and the output of C(ip); changes nothing.
author:
  - raymetal contributors (@raymetal)
"""

EXAMPLES = r"""
- name: Detect the fabric interface, failing when there is no RDMA fabric
  raymetal.cluster.fabric_facts:

- name: Use ib0 and accept a plain Ethernet interface (lab, CI)
  raymetal.cluster.fabric_facts:
    interface: ib0
    require_rdma: false

- name: Show what was chosen
  ansible.builtin.debug:
    msg: "{{ ansible_facts['fabric']['interface'] }} {{ ansible_facts['fabric']['address'] }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: complex
  contains:
    fabric:
      description: The chosen fabric interface and what was seen.
      returned: success
      type: complex
      contains:
        interface:
          description: Name of the chosen network interface.
          returned: success
          type: str
          sample: ib0
        address:
          description: IPv4 address of the chosen interface.
          returned: success
          type: str
          sample: 10.231.20.11
        prefix:
          description: Prefix length of that address.
          returned: success
          type: int
          sample: 24
        kind:
          description:
            - C(infiniband) for IPoIB (also Omni-Path), C(roce) for an
              Ethernet interface bound to an RDMA port, C(ethernet) otherwise.
          returned: success
          type: str
          sample: infiniband
        hcas:
          description:
            - Active RDMA ports usable by NCCL, as C(device:port), in the
              form NCCL_IB_HCA expects.
            - For C(infiniband), every ACTIVE port whose link layer is
              InfiniBand; for C(roce), every ACTIVE Ethernet-link-layer port
              whose interface is up and has IPv4; empty for C(ethernet).
          returned: success
          type: list
          elements: str
          sample: ["mlx5_0:1", "mlx5_1:1"]
        rdma_devices:
          description: Every RDMA port found under sysfs.
          returned: success
          type: list
          elements: dict
          sample:
            - name: mlx5_0
              port: 1
              state: ACTIVE
              link_layer: InfiniBand
              rate: 200 Gb/sec (4X HDR)
              netdev: ib0
          contains:
            name:
              description: RDMA device name.
              type: str
              sample: mlx5_0
            port:
              description: Port number (from 1).
              type: int
              sample: 1
            state:
              description: Port state without its number (C(ACTIVE), C(DOWN), C(INIT), ...).
              type: str
              sample: ACTIVE
            link_layer:
              description: C(InfiniBand) or C(Ethernet).
              type: str
              sample: InfiniBand
            rate:
              description: Port rate as the kernel reports it.
              type: str
              sample: 200 Gb/sec (4X HDR)
            netdev:
              description: Network interface bound to this port, or null.
              type: str
              sample: ib0
        candidates:
          description: Every interface considered, with the verdict on each.
          returned: success
          type: list
          elements: dict
          sample:
            - name: ib0
              kind: infiniband
              address: 10.231.20.11/24
              state: up
              chosen: true
              reason: first active IPoIB interface with IPv4
          contains:
            name:
              description: Interface name.
              type: str
              sample: ib3
            kind:
              description: C(infiniband), C(roce), C(ethernet) or C(other).
              type: str
              sample: infiniband
            address:
              description: First IPv4 address with prefix, or null.
              type: str
              sample: 10.231.20.14/24
            state:
              description: Operational state from sysfs (C(up), C(down), ...).
              type: str
              sample: down
            chosen:
              description: Whether this interface was chosen.
              type: bool
              sample: false
            reason:
              description: Why it was chosen or rejected.
              type: str
              sample: "operstate is down; RDMA port mlx5_3:1 is DOWN"
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

try:  # as a collection (raymetal.cluster)
    from ansible_collections.raymetal.cluster.plugins.module_utils.raymetal_command import run_c_locale
    from ansible_collections.raymetal.cluster.plugins.module_utils.raymetal_sysfs import (
        list_dir, natural_key, read_int, read_text)
except ImportError:  # as a playbook project (ansible.cfg: module_utils = plugins/module_utils)
    from ansible.module_utils.raymetal_command import run_c_locale
    from ansible.module_utils.raymetal_sysfs import list_dir, natural_key, read_int, read_text

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32
ARPHRD_LOOPBACK = 772


class FabricError(Exception):
    """Raised when no interface can be chosen; the message says why."""


def read_netdevs(sysfs_root):
    """Map interface name to its link type, operstate and MAC from sysfs."""
    netdevs = {}
    base = os.path.join(sysfs_root, "class", "net")
    for name in list_dir(base):
        path = os.path.join(base, name)
        netdevs[name] = {
            "type": read_int(os.path.join(path, "type")),
            "operstate": read_text(os.path.join(path, "operstate")) or "unknown",
            "mac": read_text(os.path.join(path, "address")),
        }
    return netdevs


def parse_port_state(text):
    """'4: ACTIVE' -> 'ACTIVE'; None -> 'UNKNOWN'."""
    if not text:
        return "UNKNOWN"
    return text.split(":", 1)[-1].strip().upper()


def _port_netdev(device_path, port):
    """Find the interface bound to one port of an RDMA device.

    The netdevs of the device's PCI function are listed in device/net. With
    one netdev it serves every port; with several (mlx4 dual-port cards),
    each netdev's dev_port (0-based; dev_id on old kernels where every
    dev_port is 0) names its port.
    """
    net_dir = os.path.join(device_path, "device", "net")
    names = list_dir(net_dir)
    if not names:
        return None
    if len(names) == 1:
        return names[0]
    numbers = {}
    for name in names:
        numbers[name] = (read_int(os.path.join(net_dir, name, "dev_port")),
                         read_int(os.path.join(net_dir, name, "dev_id"), 16))
    use_dev_port = len(set(n[0] for n in numbers.values())) == len(names)
    for name in names:
        index = numbers[name][0] if use_dev_port else numbers[name][1]
        if index is not None and index + 1 == port:
            return name
    return None


def read_rdma_ports(sysfs_root):
    """List every port of every RDMA device found in sysfs."""
    ports = []
    base = os.path.join(sysfs_root, "class", "infiniband")
    for device in list_dir(base):
        device_path = os.path.join(base, device)
        port_names = [p for p in list_dir(os.path.join(device_path, "ports")) if p.isdigit()]
        for port_name in port_names:
            port_path = os.path.join(device_path, "ports", port_name)
            port = int(port_name)
            ports.append({
                "name": device,
                "port": port,
                "state": parse_port_state(read_text(os.path.join(port_path, "state"))),
                "link_layer": read_text(os.path.join(port_path, "link_layer")) or "InfiniBand",
                "rate": read_text(os.path.join(port_path, "rate")),
                "netdev": _port_netdev(device_path, port),
            })
    return ports


def parse_ip_addr(text):
    """Parse `ip -j addr show` into {name: {'operstate', 'ipv4': [(addr, prefix)]}}.

    Global, primary addresses come first.
    """
    try:
        data = json.loads(text or "[]")
    except ValueError as exc:
        raise FabricError("cannot parse the output of 'ip -j addr show' (%s): %r" % (exc, (text or "")[:200]))
    links = {}
    for link in data:
        name = link.get("ifname")
        if not name:
            continue
        infos = [i for i in link.get("addr_info", []) if i.get("family") == "inet" and i.get("local")]
        infos.sort(key=lambda i: (i.get("scope") != "global", bool(i.get("secondary"))))
        links[name] = {
            "operstate": str(link.get("operstate", "unknown")).lower(),
            "ipv4": [(i["local"], int(i.get("prefixlen", 32))) for i in infos],
        }
    return links


def parse_default_route(text):
    """Name of the interface of the default IPv4 route with the lowest metric, or None."""
    try:
        data = json.loads(text or "[]")
    except ValueError as exc:
        raise FabricError("cannot parse the output of 'ip -j route show default' (%s): %r" % (exc, (text or "")[:200]))
    routes = [r for r in data if r.get("dst") == "default" and r.get("dev")]
    if not routes:
        return None
    routes.sort(key=lambda r: int(r.get("metric", 0)))
    return routes[0]["dev"]


def classify(netdevs, ports, links):
    """Build one candidate per interface known to sysfs (loopback excluded).

    Each candidate carries its kind, first IPv4 address, state, bound RDMA
    ports, whether it is usable as an RDMA fabric, and the rejection reason.
    """
    by_netdev = {}
    for port in ports:
        if port["netdev"]:
            by_netdev.setdefault(port["netdev"], []).append(port)
    candidates = []
    for name in sorted(netdevs, key=natural_key):
        info = netdevs[name]
        if info["type"] == ARPHRD_LOOPBACK or name == "lo":
            continue
        bound = by_netdev.get(name, [])
        if info["type"] == ARPHRD_INFINIBAND:
            kind = "infiniband"
        elif info["type"] == ARPHRD_ETHER and any(p["link_layer"] == "Ethernet" for p in bound):
            kind = "roce"
        elif info["type"] == ARPHRD_ETHER:
            kind = "ethernet"
        else:
            kind = "other"
        ipv4 = links.get(name, {}).get("ipv4", [])
        problems = []
        if kind == "ethernet":
            problems.append("not an RDMA interface (Ethernet, no RDMA port bound to it)")
        elif kind == "other":
            problems.append("link type %s is neither Ethernet nor IPoIB" % info["type"])
        if kind in ("infiniband", "roce"):
            if info["operstate"] != "up":
                problems.append("operstate is %s" % info["operstate"])
            inactive = ["%s:%d is %s" % (p["name"], p["port"], p["state"]) for p in bound if p["state"] != "ACTIVE"]
            if inactive and not any(p["state"] == "ACTIVE" for p in bound):
                problems.append("RDMA port %s" % ", ".join(inactive))
        if not ipv4:
            problems.append("no IPv4 address")
        candidates.append({
            "name": name,
            "kind": kind,
            "address": "%s/%d" % ipv4[0] if ipv4 else None,
            "state": info["operstate"],
            "chosen": False,
            "reason": "; ".join(problems),
            "_ipv4": ipv4,
            "_usable_rdma": kind in ("infiniband", "roce") and not problems,
        })
    return candidates


def describe_links(links):
    """'eth0 (10.0.0.2/24), ib0 (no IPv4)' for error messages."""
    parts = []
    for name in sorted(links, key=natural_key):
        ipv4 = links[name]["ipv4"]
        parts.append("%s (%s)" % (name, ", ".join("%s/%d" % a for a in ipv4) if ipv4 else "no IPv4"))
    return ", ".join(parts) or "none"


def describe_candidates(candidates):
    """One line per rejected candidate for error messages."""
    if not candidates:
        return "no network interfaces found in sysfs"
    return "; ".join("%s [%s, %s]: %s" % (c["name"], c["kind"], c["address"] or "no IPv4", c["reason"] or "usable")
                     for c in candidates)


def select_hcas(kind, ports, candidates):
    """Active ports usable by NCCL for the chosen kind (see RETURN)."""
    if kind == "infiniband":
        return ["%s:%d" % (p["name"], p["port"]) for p in ports
                if p["state"] == "ACTIVE" and p["link_layer"] == "InfiniBand"]
    if kind == "roce":
        usable = set(c["name"] for c in candidates if c["kind"] == "roce" and c["_usable_rdma"])
        return ["%s:%d" % (p["name"], p["port"]) for p in ports
                if p["state"] == "ACTIVE" and p["link_layer"] == "Ethernet" and p["netdev"] in usable]
    return []


def choose(netdevs, ports, links, default_dev, interface=None, require_rdma=True):
    """Pick the fabric interface. Returns (fact dict, warnings); raises FabricError."""
    candidates = classify(netdevs, ports, links)
    by_name = dict((c["name"], c) for c in candidates)
    warnings = []
    chosen = None

    if interface:
        if interface not in links:
            raise FabricError("interface '%s' (fabric interface requested explicitly) does not exist on this host; "
                              "interfaces present: %s" % (interface, describe_links(links)))
        if not links[interface]["ipv4"]:
            raise FabricError("interface '%s' (fabric interface requested explicitly) has no IPv4 address; "
                              "interfaces present: %s" % (interface, describe_links(links)))
        chosen = by_name.get(interface)
        if chosen is None:
            chosen = {"name": interface, "kind": "ethernet", "address": "%s/%d" % links[interface]["ipv4"][0],
                      "state": links[interface]["operstate"], "chosen": False, "reason": "",
                      "_ipv4": links[interface]["ipv4"], "_usable_rdma": False}
            candidates.append(chosen)
        if require_rdma and chosen["kind"] not in ("infiniband", "roce"):
            raise FabricError("interface '%s' was requested, but it is %s, not InfiniBand or RoCE, and require_rdma "
                              "is true; set require_rdma=false to accept it. Candidates: %s"
                              % (interface, chosen["kind"], describe_candidates(candidates)))
        if chosen["state"] not in ("up", "unknown"):
            warnings.append("fabric interface '%s' was requested explicitly but its operstate is %s"
                            % (interface, chosen["state"]))
        chosen["reason"] = "requested explicitly"
    else:
        for kind, why in (("infiniband", "first active IPoIB interface with IPv4"),
                          ("roce", "first active RoCE interface with IPv4 (no usable IPoIB interface)")):
            usable = [c for c in candidates if c["kind"] == kind and c["_usable_rdma"]]
            if usable:
                chosen = usable[0]
                chosen["reason"] = why
                break
        if chosen is None:
            if require_rdma:
                raise FabricError("no active InfiniBand or RoCE interface with an IPv4 address was found and "
                                  "require_rdma is true. Candidates: %s. Set the interface explicitly, fix the "
                                  "fabric, or set require_rdma=false to fall back to the default-route interface"
                                  % describe_candidates(candidates))
            if not default_dev or not links.get(default_dev, {}).get("ipv4"):
                raise FabricError("no active InfiniBand or RoCE interface with an IPv4 address was found, and there "
                                  "is no default-route interface with IPv4 to fall back to (default route via: %s). "
                                  "Candidates: %s" % (default_dev or "none", describe_candidates(candidates)))
            chosen = by_name.get(default_dev)
            if chosen is None:
                chosen = {"name": default_dev, "kind": "ethernet", "state": links[default_dev]["operstate"],
                          "address": "%s/%d" % links[default_dev]["ipv4"][0], "chosen": False,
                          "_ipv4": links[default_dev]["ipv4"], "_usable_rdma": False}
                candidates.append(chosen)
            chosen["reason"] = "default-route interface (no usable RDMA interface; require_rdma is false)"
            warnings.append("no active InfiniBand or RoCE interface with an IPv4 address was found; falling back to "
                            "the default-route interface %s (%s). Candidates: %s"
                            % (default_dev, chosen["address"], describe_candidates(candidates)))

    chosen["chosen"] = True
    for other in candidates:
        if other is not chosen and not other["reason"]:
            other["reason"] = "usable, but %s was preferred" % chosen["name"]
    address, prefix = chosen["_ipv4"][0]
    fact = {
        "interface": chosen["name"],
        "address": address,
        "prefix": prefix,
        "kind": chosen["kind"] if chosen["kind"] in ("infiniband", "roce") else "ethernet",
        "hcas": select_hcas(chosen["kind"], ports, candidates),
        "rdma_devices": ports,
        "candidates": [dict((k, v) for k, v in c.items() if not k.startswith("_")) for c in candidates],
    }
    return fact, warnings


def run_ip(module, ip_bin, args):
    """Run `ip` with the C locale and return stdout; fail naming the command."""
    return run_c_locale(module, [ip_bin] + args)


def build_module():
    """The module's argument spec."""
    return AnsibleModule(
        argument_spec=dict(
            interface=dict(type="str", required=False),
            require_rdma=dict(type="bool", default=True),
            sysfs_root=dict(type="path", default="/sys"),
        ),
        supports_check_mode=True,
    )


def main():
    """Entry point."""
    module = build_module()
    sysfs_root = module.params["sysfs_root"]
    if not os.path.isdir(os.path.join(sysfs_root, "class", "net")):
        module.fail_json(msg="sysfs_root '%s' has no class/net directory; is it a sysfs tree?" % sysfs_root)
    ip_bin = module.get_bin_path("ip")
    if not ip_bin:
        # Seen on a GPU cloud image that ships without iproute2.
        module.fail_json(msg="the ip command is not installed; it reads the node's addresses and routes. "
                             "Fix: install the iproute2 package on this node")
    try:
        links = parse_ip_addr(run_ip(module, ip_bin, ["-j", "addr", "show"]))
        default_dev = parse_default_route(run_ip(module, ip_bin, ["-j", "-4", "route", "show", "default"]))
        fact, warnings = choose(
            read_netdevs(sysfs_root),
            read_rdma_ports(sysfs_root),
            links,
            default_dev,
            interface=module.params["interface"] or None,
            require_rdma=module.params["require_rdma"],
        )
    except FabricError as exc:
        module.fail_json(msg=str(exc))
    for warning in warnings:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts={"fabric": fact})


if __name__ == "__main__":
    main()
