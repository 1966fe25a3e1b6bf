# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Filters for the raymetal firewall role.

They validate address and port input with Python's ipaddress module (so the
role does not need ansible.utils) and turn the Ray port list into the plan
that the nftables template, the ufw tasks and the firewalld tasks all share.
Everything here runs on the controller and is pure: unit tests call the
functions directly.
"""

from __future__ import annotations

import ipaddress
import re
import shlex


PROTOS = ("tcp", "udp")
# closed: a port Ray listens on that no other host may reach (only loopback).
SCOPES = ("all", "head", "closed")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _source_error(value):
    """Return None when value is a usable address or network, else why not."""
    if not isinstance(value, str) or not value.strip():
        return "not a string address or CIDR"
    text = value.strip()
    try:
        if "/" in text:
            ipaddress.ip_network(text, strict=True)
        else:
            ipaddress.ip_address(text)
    except ValueError as exc:
        if "/" in text:
            try:
                net = ipaddress.ip_network(text, strict=False)
                return "has host bits set; use %s" % net
            except ValueError:
                pass
        return str(exc)
    return None


def firewall_invalid_sources(values, varname="sources"):
    """List a readable error for every bad address/CIDR in values."""
    if values is None:
        return []
    if not isinstance(values, (list, tuple)):
        return ["%s must be a list of IPs/CIDRs, got %r" % (varname, values)]
    errors = []
    for value in values:
        why = _source_error(value)
        if why:
            errors.append("%s: %r is not a valid IP address or CIDR (%s)" % (varname, value, why))
    return errors


def parse_port(value):
    """Return (lo, hi) for an int, a digit string or a 'lo-hi' range.

    Raises ValueError with a message that names the value.
    """
    if isinstance(value, bool):
        raise ValueError("%r is a boolean, not a port" % (value,))
    if isinstance(value, int):
        lo = hi = value
    elif isinstance(value, str) and value.strip().isdigit():
        lo = hi = int(value.strip())
    elif isinstance(value, str) and _RANGE.match(value):
        match = _RANGE.match(value)
        lo, hi = int(match.group(1)), int(match.group(2))
    else:
        raise ValueError("%r is neither a port number nor a 'lo-hi' range" % (value,))
    for number in (lo, hi):
        if not 1 <= number <= 65535:
            raise ValueError("%r is outside 1-65535" % (value,))
    if lo > hi:
        raise ValueError("%r has its low end above its high end; write '%d-%d'" % (value, hi, lo))
    return lo, hi


def firewall_invalid_ports(ports, varname="firewall_ports"):
    """List a readable error for every bad entry of the port list."""
    if ports is None:
        return []
    if not isinstance(ports, (list, tuple)):
        return ["%s must be a list of dicts, got %r" % (varname, ports)]
    errors = []
    seen = {}
    for index, entry in enumerate(ports):
        where = "%s[%d]" % (varname, index)
        if not isinstance(entry, dict):
            errors.append("%s: %r is not a dict with name/port/proto/scope" % (where, entry))
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            errors.append("%s.name: %r must be a word of letters, digits, '_', '.' or '-'" % (where, name))
        elif name in seen:
            errors.append("%s.name: %r is already used by %s[%d]" % (where, name, varname, seen[name]))
        else:
            seen[name] = index
        try:
            parse_port(entry.get("port"))
        except ValueError as exc:
            errors.append("%s.port: %s; use a number 1-65535 or a range 'lo-hi' with lo <= hi" % (where, exc))
        proto = entry.get("proto", "tcp")
        if proto not in PROTOS:
            errors.append("%s.proto: %r must be one of %s" % (where, proto, "/".join(PROTOS)))
        scope = entry.get("scope", "all")
        if scope not in SCOPES:
            errors.append("%s.scope: %r must be one of %s" % (where, scope, "/".join(SCOPES)))
        for flag in ("admin", "metrics"):
            if not isinstance(entry.get(flag, False), bool):
                errors.append("%s.%s: %r must be a boolean true/false" % (where, flag, entry.get(flag)))
        if "sources" in entry:
            if not entry["sources"]:
                errors.append("%s.sources: empty; give the addresses that may reach this port, or leave sources out "
                              "(then the cluster's)" % where)
            errors.extend(firewall_invalid_sources(entry["sources"], "%s.sources" % where))
    return errors


def firewall_split_sources(*lists):
    """Merge address lists; return {'v4': [...], 'v6': [...]}.

    Duplicates and entries inside another listed network are dropped
    (nftables interval sets refuse overlaps); hosts stay single addresses
    so that a diff shows which node was added. Output is sorted.
    """
    found = {4: set(), 6: set()}
    for values in lists:
        for value in values or []:
            net = ipaddress.ip_network(value.strip(), strict=False)
            found[net.version].add(net)
    result = {}
    for version, key in ((4, "v4"), (6, "v6")):
        kept = []
        for net in sorted(found[version], key=lambda n: (n.prefixlen, n)):
            if not any(net.subnet_of(wider) for wider in kept):
                kept.append(net)
        result[key] = [
            str(net.network_address) if net.num_addresses == 1 else str(net)
            for net in sorted(kept)
        ]
    return result


def firewall_port_plan(ports, node_role="worker"):
    """Return the ports that apply on a node, normalised.

    Each item: name, proto, lo, hi, nft ('6379' or '10002-19999'),
    ufw ('6379' or '10002:19999'), admin, metrics, scope, and sources:
    None (the cluster's sources may reach it) or {'v4': [...], 'v6': [...]}
    when the entry names its own (only those, on the fabric interface).
    Head-scope ports are left out on workers.
    """
    plan = []
    for entry in ports or []:
        scope = entry.get("scope", "all")
        if scope == "head" and node_role != "head":
            continue
        lo, hi = parse_port(entry["port"])
        spec = str(lo) if lo == hi else "%d-%d" % (lo, hi)
        plan.append({
            "name": entry["name"],
            "proto": entry.get("proto", "tcp"),
            "scope": scope,
            "lo": lo,
            "hi": hi,
            "nft": spec,
            "ufw": str(lo) if lo == hi else "%d:%d" % (lo, hi),
            "firewalld": spec,
            "admin": bool(entry.get("admin", False)),
            "metrics": bool(entry.get("metrics", False)),
            "sources": firewall_split_sources(entry["sources"]) if entry.get("sources") else None,
        })
    return plan


def firewall_rule_plan(ports, node_role, interface, cluster, admin=None, prometheus=None, metrics_only=False):
    """Return the ordered rule list for rule-based backends (ufw, firewalld).

    cluster/admin/prometheus are the dicts firewall_split_sources returns.
    Each rule is a dict: key (unique, also the ufw comment), action
    (allow/deny), proto, port (ufw spec), port_range (firewalld spec),
    source ('any' or an address), family (4, 6 or 0 for both), interface
    ('' for any). Allows come first, then one deny per port.
    metrics_only: ports flagged metrics are not opened to the cluster, only
    to ``prometheus`` (a monitoring host scrapes them).
    """
    admin = admin or {"v4": [], "v6": []}
    prometheus = prometheus or {"v4": [], "v6": []}
    iface = "" if interface in (None, "", "any") else interface
    allows, denies = [], []
    for port in firewall_port_plan(ports, node_role):
        base = "raymetal:%s:%s/%s" % (port["name"], port["nft"], port["proto"])
        closed = port["scope"] == "closed" or (metrics_only and port["metrics"])
        groups = [] if closed else [(iface, port["sources"] or cluster)]
        if port["admin"]:
            groups.append(("", admin))
        if port["metrics"]:
            groups.append(("", prometheus))
        seen = set()
        for group_iface, sources in groups:
            for family, key in ((4, "v4"), (6, "v6")):
                for source in sources.get(key, []):
                    rule_key = "%s:%s:%s" % (base, group_iface or "any", source)
                    if rule_key in seen:
                        continue
                    seen.add(rule_key)
                    allows.append({
                        "key": rule_key, "action": "allow", "proto": port["proto"],
                        "port": port["ufw"], "port_range": port["firewalld"],
                        "source": source, "family": family, "interface": group_iface,
                        "name": port["name"],
                    })
        denies.append({
            "key": "%s:deny" % base, "action": "deny", "proto": port["proto"],
            "port": port["ufw"], "port_range": port["firewalld"], "source": "any",
            "family": 0, "interface": "", "name": port["name"],
        })
    return allows + denies


MEMBER_KEY = "raymetal:fabric-members:"


def firewall_member_rules(cluster, interface):
    """Rules that admit each cluster source on every port of the fabric interface (ufw, firewalld).

    The nftables table's policy is accept: a member reaches every port of another member that the table does not
    list (NCCL's and torch.distributed's ephemeral ports, iperf3, ib_write_bw's exchange), and the listed ones as
    the per-port rules say. ufw and firewalld deny by default, so these rules give members the same reach; they
    must come after the per-port rules (ufw: after the denies; firewalld: a later priority), so that a closed
    port, a port with sources of its own and a metrics-only port stay as the per-port rules say.
    """
    iface = "" if interface in (None, "", "any") else interface
    rules = []
    for family, key in ((4, "v4"), (6, "v6")):
        for source in (cluster or {}).get(key, []):
            rules.append({
                "key": "%s%s:%s" % (MEMBER_KEY, iface or "any", source), "action": "allow", "proto": "",
                "port": "", "port_range": "", "source": source, "family": family, "interface": iface,
                "name": "fabric-members",
            })
    return rules


# firewalld evaluates rich rules with a priority below 0 before everything else
# of the zone, lowest first (firewalld 0.9 and later): the per-port accepts,
# then the per-port rejects, then the members' accept on every port.
FIREWALLD_PRIORITY = {"allow": -30, "deny": -20, "members": -10}


def firewall_firewalld_rich_rules(rules):
    """Turn a rule plan (and member rules) into firewalld rich rule strings, in the order firewalld applies them."""
    result = []
    for rule in rules:
        family = "ipv4" if rule["family"] == 4 else "ipv6"
        if rule["key"].startswith(MEMBER_KEY):
            result.append('rule priority="%d" family="%s" source address="%s" accept'
                          % (FIREWALLD_PRIORITY["members"], family, rule["source"]))
        elif rule["action"] == "allow":
            result.append(
                'rule priority="%d" family="%s" source address="%s" port port="%s" protocol="%s" accept'
                % (FIREWALLD_PRIORITY["allow"], family, rule["source"], rule["port_range"], rule["proto"]))
        else:
            result.append('rule priority="%d" port port="%s" protocol="%s" reject'
                          % (FIREWALLD_PRIORITY["deny"], rule["port_range"], rule["proto"]))
    return result


def firewall_firewalld_zone_problem(interface, interface_zone, default_zone, wanted_zone):
    """Why raymetal's rich rules in wanted_zone would not filter the fabric interface ('' when they do).

    interface_zone: what `firewall-cmd --get-zone-of-interface` printed ('' when the interface is in no zone, so in
    the default zone).
    """
    if interface in (None, "", "any"):
        return ""
    zone = (interface_zone or "").strip() or (default_zone or "").strip()
    how = "is in zone %s" % zone if (interface_zone or "").strip() else "is in no zone, so in the default zone %s" % zone
    fix = ("Fix: firewall-cmd --permanent --zone=%s --change-interface=%s && firewall-cmd --reload, "
           "or set firewall_firewalld_zone to the zone %s is in (never trusted)" % (wanted_zone, interface, interface))
    if zone == "trusted":
        return ("fabric interface %s %s, which accepts everything from everyone: raymetal's rules would filter "
                "nothing. %s." % (interface, how, fix.replace(" (never trusted)", "")))
    if zone != wanted_zone:
        return ("fabric interface %s %s, but raymetal's rules go into firewall_firewalld_zone=%s, which would not "
                "filter it. %s." % (interface, how, wanted_zone, fix))
    return ""


_UFW_COMMENT = re.compile(r"comment '(raymetal[^']*)'")


def firewall_ufw_added(stdout):
    """Parse `ufw show added`; return [{'key': comment, 'args': [...]}] for raymetal rules."""
    result = []
    for line in (stdout or "").splitlines():
        line = line.strip()
        if not line.startswith("ufw "):
            continue
        match = _UFW_COMMENT.search(line)
        if not match:
            continue
        try:
            args = shlex.split(line)[1:]
        except ValueError:
            continue
        result.append({"key": match.group(1), "args": args})
    return result


def firewall_ssh_rule(port):
    """The allow rule that keeps the SSH port Ansible uses open (ufw backend)."""
    port = int(port)
    return {
        "key": "raymetal:ssh:%d/tcp:any:any" % port, "action": "allow", "proto": "tcp",
        "port": str(port), "port_range": str(port), "source": "any", "family": 0,
        "interface": "", "name": "ssh",
    }


def firewall_ufw_args(rule):
    """Build the ufw argument list (after 'ufw' and 'insert N') for a planned rule."""
    args = [rule["action"]]
    if rule.get("interface"):
        args += ["in", "on", rule["interface"]]
    else:
        args += ["in"]
    if rule.get("port"):
        args += ["from", rule["source"], "to", "any", "port", rule["port"], "proto", rule["proto"]]
    else:
        # A member rule: every port and protocol from this source.
        args += ["from", rule["source"]]
    args += ["comment", rule["key"]]
    return args


class FilterModule(object):
    """raymetal firewall filters."""

    def filters(self):
        return {
            "firewall_invalid_sources": firewall_invalid_sources,
            "firewall_invalid_ports": firewall_invalid_ports,
            "firewall_split_sources": firewall_split_sources,
            "firewall_port_plan": firewall_port_plan,
            "firewall_rule_plan": firewall_rule_plan,
            "firewall_firewalld_rich_rules": firewall_firewalld_rich_rules,
            "firewall_member_rules": firewall_member_rules,
            "firewall_firewalld_zone_problem": firewall_firewalld_zone_problem,
            "firewall_ufw_added": firewall_ufw_added,
            "firewall_ufw_args": firewall_ufw_args,
            "firewall_ssh_rule": firewall_ssh_rule,
        }
