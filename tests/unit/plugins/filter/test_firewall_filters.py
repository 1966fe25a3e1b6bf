"""Unit tests for plugins/filter/firewall.py (validation and rule planning)."""

from __future__ import annotations

import pathlib

import pytest

from ansible_collections.raymetal.cluster.plugins.filter import firewall as fw

ROOT = pathlib.Path(__file__).resolve().parents[4]

# The list the Ray role publishes as ray_ports (client port left out: off by default).
RAY_PORTS = [
    {"name": "gcs", "port": 6379, "proto": "tcp", "scope": "head"},
    {"name": "dashboard", "port": 8265, "proto": "tcp", "scope": "head", "admin": True},
    {"name": "dashboard_agent_listen", "port": 52365, "scope": "all"},
    {"name": "node_manager", "port": 6380},
    {"name": "object_manager", "port": 6381},
    {"name": "runtime_env_agent", "port": 6382},
    {"name": "dashboard_agent_grpc", "port": 6383},
    {"name": "metrics_export", "port": 6384, "metrics": True},
    {"name": "worker_ports", "port": "10002-19999"},
]


# `ufw show added` as recorded on a lab node (ufw 0.36.2, Debian 12), with one
# rule raymetal does not own.
UFW_SHOW_ADDED = """Added user rules (see 'ufw status' for running firewall):
ufw allow in on ib0 from 10.231.121.11 to any port 6379 proto tcp comment 'raymetal:gcs:6379/tcp:ib0:10.231.121.11'
ufw allow 22/tcp comment 'raymetal:ssh:22/tcp:any:any'
ufw allow 9000/tcp comment 'not-raymetal'
ufw allow 8080/tcp
ufw deny 6379/tcp comment 'raymetal:gcs:6379/tcp:deny'
ufw allow in on ib0 from 10.231.121.10 to any port 10002:19999 proto tcp comment 'raymetal:worker_ports:10002-19999/tcp:ib0:10.231.121.10'
"""


def test_ray_port_list_is_valid():
    assert fw.firewall_invalid_ports(RAY_PORTS) == []


@pytest.mark.parametrize(
    "port, expected",
    [(6379, (6379, 6379)), ("8265", (8265, 8265)), ("10002-19999", (10002, 19999)), (" 1 - 65535 ", (1, 65535)),
     (65535, (65535, 65535)), ("7-7", (7, 7))],
)
def test_parse_port_accepts(port, expected):
    assert fw.parse_port(port) == expected


@pytest.mark.parametrize(
    "port, fragment",
    [(0, "outside 1-65535"), (65536, "outside 1-65535"), ("19999-10002", "write '10002-19999'"),
     ("abc", "neither a port"), (True, "boolean"), (None, "neither a port"), ("10-70000", "outside"),
     ("10:20", "neither a port"), (6379.5, "neither a port")],
)
def test_parse_port_rejects(port, fragment):
    with pytest.raises(ValueError) as exc:
        fw.parse_port(port)
    assert fragment in str(exc.value)


def test_invalid_ports_names_entry_value_and_fix():
    errors = fw.firewall_invalid_ports([
        {"name": "gcs", "port": 6379},
        {"name": "bad", "port": "20-10"},
        {"name": "gcs", "port": 1},
        {"name": "x", "port": 5, "proto": "sctp", "scope": "everywhere", "admin": "yes"},
        "not-a-dict",
        {"port": 7},
    ])
    text = "\n".join(errors)
    assert "firewall_ports[1].port: '20-10' has its low end above its high end" in text
    assert "lo <= hi" in text
    assert "firewall_ports[2].name: 'gcs' is already used by firewall_ports[0]" in text
    assert "firewall_ports[3].proto: 'sctp' must be one of tcp/udp" in text
    assert "firewall_ports[3].scope: 'everywhere'" in text
    assert "firewall_ports[3].admin: 'yes' must be a boolean" in text
    assert "firewall_ports[4]: 'not-a-dict' is not a dict" in text
    assert "firewall_ports[5].name: None" in text
    assert len(errors) == 7


def test_invalid_ports_rejects_non_list():
    assert fw.firewall_invalid_ports("6379") == ["firewall_ports must be a list of dicts, got '6379'"]
    assert fw.firewall_invalid_ports(None) == []


@pytest.mark.parametrize("value", ["10.231.20.10", "10.231.20.0/24", "fd00::1", "fd00::/64", "0.0.0.0/0"])
def test_valid_sources(value):
    assert fw.firewall_invalid_sources([value], "firewall_cluster_sources") == []


@pytest.mark.parametrize(
    "value, fragment",
    [("10.231.20.5/24", "host bits set; use 10.231.20.0/24"), ("10.231.20.300", "does not appear to be"),
     ("ib0", "does not appear to be"), ("", "not a string"), (42, "not a string"), ("10.0.0.0/33", "")],
)
def test_invalid_sources(value, fragment):
    errors = fw.firewall_invalid_sources([value], "firewall_admin_cidrs")
    assert len(errors) == 1
    assert errors[0].startswith("firewall_admin_cidrs: %r is not a valid IP address or CIDR" % (value,))
    assert fragment in errors[0]


def test_invalid_sources_rejects_a_string():
    assert "must be a list" in fw.firewall_invalid_sources("10.0.0.1", "firewall_cluster_sources")[0]


def test_split_sources_dedupes_and_drops_covered_entries():
    result = fw.firewall_split_sources(
        ["10.231.20.11", "10.231.20.10", "10.231.20.10/32", "fd00::2"],
        ["192.168.0.0/16", "192.168.7.1", "fd00::/120"],
    )
    assert result == {"v4": ["10.231.20.10", "10.231.20.11", "192.168.0.0/16"], "v6": ["fd00::/120"]}


def test_split_sources_empty():
    assert fw.firewall_split_sources([], None) == {"v4": [], "v6": []}


def test_port_plan_leaves_head_ports_out_on_workers():
    worker = [p["name"] for p in fw.firewall_port_plan(RAY_PORTS, "worker")]
    head = [p["name"] for p in fw.firewall_port_plan(RAY_PORTS, "head")]
    assert "gcs" not in worker and "dashboard" not in worker
    assert head[:2] == ["gcs", "dashboard"]
    assert len(head) == len(RAY_PORTS)
    assert len(worker) == len(RAY_PORTS) - 2


def test_port_plan_formats_ranges_per_backend():
    plan = {p["name"]: p for p in fw.firewall_port_plan(RAY_PORTS, "head")}
    assert plan["worker_ports"]["nft"] == "10002-19999"
    assert plan["worker_ports"]["ufw"] == "10002:19999"
    assert plan["worker_ports"]["firewalld"] == "10002-19999"
    assert plan["gcs"]["ufw"] == "6379"
    assert plan["gcs"]["proto"] == "tcp"
    assert plan["dashboard"]["admin"] is True
    assert plan["metrics_export"]["metrics"] is True


def _plan(role="head", iface="ib0", admin=None, prom=None):
    cluster = fw.firewall_split_sources(["10.231.20.10", "10.231.20.11"])
    return fw.firewall_rule_plan(
        RAY_PORTS, role, iface, cluster,
        fw.firewall_split_sources(admin or []), fw.firewall_split_sources(prom or []),
    )


def test_rule_plan_allows_come_before_denies_and_keys_are_unique():
    rules = _plan(admin=["192.0.2.0/28"], prom=["198.51.100.7"])
    actions = [r["action"] for r in rules]
    assert actions == sorted(actions)  # "allow" < "deny": every allow first
    keys = [r["key"] for r in rules]
    assert len(keys) == len(set(keys))
    assert all(k.startswith("raymetal:") and " " not in k for k in keys)


def test_rule_plan_contents():
    rules = _plan(admin=["192.0.2.0/28"], prom=["198.51.100.7"])
    by_key = {r["key"]: r for r in rules}
    gcs = by_key["raymetal:gcs:6379/tcp:ib0:10.231.20.11"]
    assert (gcs["action"], gcs["interface"], gcs["source"], gcs["port"]) == ("allow", "ib0", "10.231.20.11", "6379")
    # Admin and Prometheus networks are allowed on any interface, only on flagged ports.
    assert "raymetal:dashboard:8265/tcp:any:192.0.2.0/28" in by_key
    assert "raymetal:gcs:6379/tcp:any:192.0.2.0/28" not in by_key
    assert "raymetal:metrics_export:6384/tcp:any:198.51.100.7" in by_key
    assert "raymetal:node_manager:6380/tcp:any:198.51.100.7" not in by_key
    deny = by_key["raymetal:worker_ports:10002-19999/tcp:deny"]
    assert (deny["source"], deny["port"], deny["family"]) == ("any", "10002:19999", 0)
    assert len([r for r in rules if r["action"] == "deny"]) == len(RAY_PORTS)


def test_rule_plan_worker_has_no_head_ports():
    rules = _plan(role="worker")
    assert not [r for r in rules if r["name"] in ("gcs", "dashboard")]


def test_rule_plan_any_interface():
    rules = _plan(iface="any")
    assert all(r["interface"] == "" for r in rules)
    assert "raymetal:gcs:6379/tcp:any:10.231.20.10" in {r["key"] for r in rules}


def test_ufw_args_round_trip_through_show_added():
    rule = _plan()[0]
    args = fw.firewall_ufw_args(rule)
    assert args == ["allow", "in", "on", "ib0", "from", "10.231.20.10", "to", "any", "port", "6379",
                    "proto", "tcp", "comment", "raymetal:gcs:6379/tcp:ib0:10.231.20.10"]
    deny = fw.firewall_ufw_args(_plan()[-1])
    assert deny[:2] == ["deny", "in"] and "on" not in deny


def test_ufw_added_parses_only_raymetal_rules():
    rules = fw.firewall_ufw_added(UFW_SHOW_ADDED)
    assert [r["key"] for r in rules] == [
        "raymetal:gcs:6379/tcp:ib0:10.231.121.11",
        "raymetal:ssh:22/tcp:any:any",
        "raymetal:gcs:6379/tcp:deny",
        "raymetal:worker_ports:10002-19999/tcp:ib0:10.231.121.10",
    ]
    assert rules[0]["args"] == ["allow", "in", "on", "ib0", "from", "10.231.121.11", "to", "any", "port", "6379",
                                "proto", "tcp", "comment", "raymetal:gcs:6379/tcp:ib0:10.231.121.11"]
    assert rules[1]["args"] == ["allow", "22/tcp", "comment", "raymetal:ssh:22/tcp:any:any"]


def test_ufw_added_empty():
    assert fw.firewall_ufw_added("Added user rules (see 'ufw status' for running firewall):\n(None)\n") == []
    assert fw.firewall_ufw_added("") == []


def test_ssh_rule():
    rule = fw.firewall_ssh_rule("2222")
    assert rule["key"] == "raymetal:ssh:2222/tcp:any:any"
    assert fw.firewall_ufw_args(rule) == ["allow", "in", "from", "any", "to", "any", "port", "2222", "proto", "tcp",
                                          "comment", "raymetal:ssh:2222/tcp:any:any"]


def test_firewalld_rich_rules():
    cluster = fw.firewall_split_sources(["10.231.20.10", "fd00::7"])
    rules = fw.firewall_rule_plan(RAY_PORTS[:1] + RAY_PORTS[-1:], "head", "ib0", cluster)
    rich = fw.firewall_firewalld_rich_rules(rules)
    # Issue 35: with priorities (accepts, then rejects, then the members' accept on every port), and the
    # per-port rejects the zone's target used to stand in for (members reach every other port now).
    assert rich == [
        'rule priority="-30" family="ipv4" source address="10.231.20.10" port port="6379" protocol="tcp" accept',
        'rule priority="-30" family="ipv6" source address="fd00::7" port port="6379" protocol="tcp" accept',
        'rule priority="-30" family="ipv4" source address="10.231.20.10" port port="10002-19999" protocol="tcp" accept',
        'rule priority="-30" family="ipv6" source address="fd00::7" port port="10002-19999" protocol="tcp" accept',
        'rule priority="-20" port port="6379" protocol="tcp" reject',
        'rule priority="-20" port port="10002-19999" protocol="tcp" reject',
    ]


def test_filter_module_exports():
    names = set(fw.FilterModule().filters())
    assert {"firewall_invalid_ports", "firewall_invalid_sources", "firewall_split_sources", "firewall_port_plan",
            "firewall_rule_plan", "firewall_ufw_added", "firewall_ufw_args", "firewall_ssh_rule",
            "firewall_firewalld_rich_rules"} <= names


def test_closed_port_is_denied_to_the_cluster_too():
    ports = RAY_PORTS + [{"name": "client_server", "port": 10001, "scope": "closed"}]
    rules = fw.firewall_rule_plan(
        ports, "head", "ib0", fw.firewall_split_sources(["10.231.20.11"]),
        fw.firewall_split_sources(["192.0.2.0/28"]), None,
    )
    client = [r for r in rules if r["name"] == "client_server"]
    assert [r["action"] for r in client] == ["deny"]
    assert not fw.firewall_invalid_ports(ports)


def test_closed_admin_port_is_open_to_admins_only():
    ports = [{"name": "client_server", "port": 10001, "scope": "closed", "admin": True}]
    rules = fw.firewall_rule_plan(
        ports, "head", "ib0", fw.firewall_split_sources(["10.231.20.11"]),
        fw.firewall_split_sources(["192.0.2.0/28"]), None,
    )
    assert [(r["action"], r["source"]) for r in rules] == [("allow", "192.0.2.0/28"), ("deny", "any")]


def test_a_port_with_its_own_sources_admits_only_them_on_the_fabric():
    ports = RAY_PORTS + [{"name": "gcs_redis", "port": 6390, "sources": ["10.231.20.10"]}]
    assert not fw.firewall_invalid_ports(ports)
    plan = {p["name"]: p for p in fw.firewall_port_plan(ports, "worker")}
    assert plan["gcs_redis"]["sources"] == {"v4": ["10.231.20.10"], "v6": []}
    assert plan["node_manager"]["sources"] is None
    rules = fw.firewall_rule_plan(ports, "worker", "ib0", fw.firewall_split_sources(["10.231.20.10", "10.231.20.11"]))
    redis = [(r["action"], r["source"], r["interface"]) for r in rules if r["name"] == "gcs_redis"]
    assert redis == [("allow", "10.231.20.10", "ib0"), ("deny", "any", "")]
    node_manager = [r["source"] for r in rules if r["name"] == "node_manager" and r["action"] == "allow"]
    assert node_manager == ["10.231.20.10", "10.231.20.11"]


@pytest.mark.parametrize("sources, fragment", [
    ([], "sources: empty"),
    (["10.0.0.300"], "is not a valid IP address"),
    ("10.0.0.1", "must be a list"),
])
def test_bad_port_sources_are_named(sources, fragment):
    errors = fw.firewall_invalid_ports([{"name": "gcs_redis", "port": 6390, "sources": sources}])
    assert errors and fragment in errors[0] and "firewall_ports[0].sources" in errors[0], errors


# --- the nftables table as the role renders it (roles/firewall/templates/firewall.nft.j2) ---

def render_table(members_only, role="worker", interface="ib0"):
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "roles" / "firewall" / "templates")),
                             trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["bool"] = lambda value: str(value).lower() in ("true", "1", "yes", "on")
    return env.get_template("firewall.nft.j2").render(
        __firewall_nft_bin="/usr/sbin/nft", inventory_hostname="worker1", firewall_node_role=role,
        __firewall_plan=fw.firewall_port_plan(RAY_PORTS, role),
        __firewall_sets={"cluster": fw.firewall_split_sources(["10.231.20.10", "10.231.20.11", "fd00::11"]),
                         "admin": fw.firewall_split_sources(["192.0.2.0/28"]),
                         "prometheus": fw.firewall_split_sources([])},
        firewall_metrics_sources=[], firewall_interface=interface, firewall_ssh_port=22,
        firewall_fabric_members_only=members_only)


def chain_lines(table):
    return [line.strip() for line in table.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_members_only_closes_the_whole_fabric_interface_to_everyone_else():
    lines = chain_lines(render_table(True))
    tail = lines[lines.index('tcp dport 10002-19999 drop') + 1:]
    # After every Ray port's own rules: SSH and neighbour discovery, then the members, then nobody else.
    assert tail == [
        'iifname "ib0" tcp dport 22 accept',
        'iifname "ib0" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-advert } accept',
        'iifname "ib0" ip saddr @cluster_v4 accept',
        'iifname "ib0" ip6 saddr @cluster_v6 accept',
        'iifname "ib0" drop',
        "}", "}",
    ]


def test_without_members_only_other_ports_keep_the_rest_of_the_ruleset():
    table = render_table(False)
    assert 'iifname "ib0" drop' not in table and "dport 22" not in table
    assert chain_lines(table)[-3:] == ["tcp dport 10002-19999 drop", "}", "}"]


@pytest.mark.parametrize("members_only", [False, True])
def test_the_rendered_table_passes_nft_check(members_only, tmp_path):
    """nft -c parses the table as the kernel would load it (where nft and netlink are usable here)."""
    import shutil
    import subprocess

    nft = shutil.which("nft") or ("/usr/sbin/nft" if pathlib.Path("/usr/sbin/nft").exists() else None)
    if nft is None:
        pytest.skip("nft is not installed on this machine: the rendered text is checked above, not parsed")
    path = tmp_path / "raymetal.nft"
    path.write_text(render_table(members_only))
    proc = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True)
    if proc.returncode != 0 and ("Operation not permitted" in proc.stderr or "netlink" in proc.stderr.lower()):
        pytest.skip("nft -c needs netlink here (not root, or no CAP_NET_ADMIN): %s" % proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr


# --- Issue 35: ufw and firewalld give members the reach the nftables table gives them ---------------------------
#
# The rendered rules of each backend are evaluated as the backend would: nftables's chain in order with policy
# accept; ufw's rules first match with its default deny incoming; firewalld's rich rules by priority, then the
# zone's reject. Members must reach every port of a node on the fabric exactly as under nftables; nobody may reach
# more under ufw or firewalld than under nftables.

import ipaddress as _ip
import re as _re

MEMBERS = ["10.231.20.10", "10.231.20.11", "fd00::11"]
OUTSIDER = "10.231.20.99"
PORTS_35 = RAY_PORTS + [
    {"name": "gcs_redis", "port": 6390, "sources": ["10.231.20.10"]},  # the Redis port: the head only
    {"name": "autoscaler_metrics", "port": 44217, "scope": "closed"},
]
# Listed ports, and ports nothing lists: torch.distributed's rendezvous, iperf3, an NCCL bootstrap port.
PROBES = [(p, "tcp") for p in (6379, 6380, 6384, 6390, 8265, 10005, 44217, 52365, 29500, 5201, 45123)] + [
    (5201, "udp"), (45123, "udp")]


def _j2(name, **context):
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "roles" / "firewall" / "templates")),
                             trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["bool"] = lambda value: str(value).lower() in ("true", "1", "yes", "on")
    env.filters["raymetal.cluster.firewall_ufw_args"] = fw.firewall_ufw_args
    return env.get_template(name).render(inventory_hostname="worker1", firewall_node_role="head", **context)


def _plan35(iface="ib0"):
    cluster = fw.firewall_split_sources(MEMBERS)
    return (fw.firewall_rule_plan(PORTS_35, "head", iface, cluster, fw.firewall_split_sources([]),
                                  fw.firewall_split_sources([]), False),
            fw.firewall_member_rules(cluster, iface))


def _in(source, spec):
    return any(_ip.ip_address(source) in _ip.ip_network(s.strip(), strict=False) for s in spec.split(","))


def _port_in(port, spec):
    lo, _, hi = spec.replace(":", "-").partition("-")
    return int(lo) <= port <= int(hi or lo)


def nft_verdict(table, source, port, proto, iface="ib0"):
    sets = {m.group(1): m.group(2) for m in _re.finditer(r"set (\w+) \{[^}]*elements = \{ ([^}]*) \}", table)}
    chain = table[table.index("chain input"):]
    for line in chain_lines(chain)[2:]:
        m = _re.match(r'(?:(tcp|udp) dport (\S+) )?(?:iifname "(\S+)" )?(?:(?:ip6?) saddr (\S+|\{ [^}]* \}) )?'
                      r'(?:tcp dport (\d+) )?(?:icmpv6 .* )?(accept|drop)$', line)
        if not m or "icmpv6" in line or "ct state" in line:
            continue
        lproto, lport, liface, lsrc, ssh, action = m.groups()
        if lproto and (lproto != proto or not _port_in(port, lport)):
            continue
        if ssh and (proto != "tcp" or port != int(ssh)):
            continue
        if liface and liface != iface:
            continue
        if lsrc:
            spec = sets[lsrc[1:]] if lsrc.startswith("@") else lsrc.strip("{} ")
            if (":" in source) != lsrc.endswith("_v6") and lsrc.startswith("@") or not _in(source, spec):
                continue
        return action == "accept"
    return True  # policy accept


def ufw_verdict(record, source, port, proto, iface="ib0"):
    for line in record.splitlines():
        if not line.startswith("ufw "):
            continue
        args = line.split()[1:]
        action, rest = args[0], args[1:]
        if rest[:2] == ["in", "on"]:
            if rest[2] != iface:
                continue
        if "from" in rest and rest[rest.index("from") + 1] != "any" and not (
                (":" in source) == (":" in rest[rest.index("from") + 1]) and _in(source, rest[rest.index("from") + 1])):
            continue
        if "port" in rest and not (_port_in(port, rest[rest.index("port") + 1]) and rest[rest.index("proto") + 1] == proto):
            continue
        return action == "allow"
    return False  # ufw's default: deny incoming


def firewalld_verdict(record, source, port, proto):
    rules = []
    for line in record.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        rule = line.split(" ", 1)[1]
        prio = int(_re.search(r'priority="(-?\d+)"', rule).group(1)) if "priority=" in rule else 0
        rules.append((prio, rule))
    for _, rule in sorted(rules, key=lambda r: r[0]):
        fam = _re.search(r'family="(ipv\d)"', rule)
        if fam and (fam.group(1) == "ipv6") != (":" in source):
            continue
        src = _re.search(r'source address="([^"]+)"', rule)
        if src and not _in(source, src.group(1)):
            continue
        prt = _re.search(r'port port="([^"]+)" protocol="(\w+)"', rule)
        if prt and not (_port_in(port, prt.group(1)) and prt.group(2) == proto):
            continue
        return rule.endswith("accept")
    return False  # the zone's target (public: reject)


def _tables():
    plan, members = _plan35()
    table = _j2("firewall.nft.j2", __firewall_nft_bin="/usr/sbin/nft",
                __firewall_plan=fw.firewall_port_plan(PORTS_35, "head"),
                __firewall_sets={"cluster": fw.firewall_split_sources(MEMBERS),
                                 "admin": fw.firewall_split_sources([]), "prometheus": fw.firewall_split_sources([])},
                firewall_metrics_sources=[], firewall_interface="ib0", firewall_ssh_port=22,
                firewall_fabric_members_only=False)
    ufw = _j2("firewall-ufw.rules.j2", __firewall_ufw_wanted=[fw.firewall_ssh_rule(22)] + plan + members)
    fwd = _j2("firewall-firewalld.rules.j2",
              __firewall_firewalld_wanted=["public " + r for r in fw.firewall_firewalld_rich_rules(plan + members)])
    return table, ufw, fwd


@pytest.mark.parametrize("source", MEMBERS)
def test_ufw_and_firewalld_give_members_the_reach_nftables_gives(source):
    table, ufw, fwd = _tables()
    for port, proto in PROBES:
        nft = nft_verdict(table, source, port, proto)
        assert ufw_verdict(ufw, source, port, proto) == nft, ("ufw", source, port, proto, nft)
        assert firewalld_verdict(fwd, source, port, proto) == nft, ("firewalld", source, port, proto, nft)
    # What nftables gives members: every port nothing lists, and the Redis port to the head alone, no closed port.
    assert nft_verdict(table, source, 29500, "tcp") and nft_verdict(table, source, 45123, "udp")
    assert nft_verdict(table, source, 6390, "tcp") == (source == "10.231.20.10")
    assert not nft_verdict(table, source, 44217, "tcp")


def test_ufw_and_firewalld_admit_an_outsider_nowhere_that_nftables_refuses_it():
    table, ufw, fwd = _tables()
    for port, proto in PROBES:
        nft = nft_verdict(table, OUTSIDER, port, proto)
        assert not (ufw_verdict(ufw, OUTSIDER, port, proto) and not nft), (port, proto)
        assert not (firewalld_verdict(fwd, OUTSIDER, port, proto) and not nft), (port, proto)
    assert not ufw_verdict(ufw, OUTSIDER, 6380, "tcp") and not firewalld_verdict(fwd, OUTSIDER, 6380, "tcp")


def test_member_rules_come_after_every_deny_in_the_ufw_record():
    _, ufw, _ = _tables()
    lines = [line for line in ufw.splitlines() if line.startswith("ufw ")]
    last_deny = max(i for i, line in enumerate(lines) if line.startswith("ufw deny"))
    members = [i for i, line in enumerate(lines) if "raymetal:fabric-members:" in line]
    assert members and min(members) > last_deny
    assert lines[members[0]] == "ufw allow in on ib0 from 10.231.20.10 comment raymetal:fabric-members:ib0:10.231.20.10"


def test_member_rules_round_trip_through_ufw_show_added():
    rule = fw.firewall_member_rules(fw.firewall_split_sources(["10.231.20.11"]), "ib0")[0]
    line = "ufw " + " ".join(fw.firewall_ufw_args(rule)[:-2]) + " comment '%s'" % rule["key"]
    assert fw.firewall_ufw_added(line) == [{"key": rule["key"], "args": fw.firewall_ufw_args(rule)}]
    assert fw.firewall_member_rules(fw.firewall_split_sources(["fd00::1"]), "any")[0]["key"] == \
        "raymetal:fabric-members:any:fd00::1"


@pytest.mark.parametrize("iface_zone, default, problem", [
    ("public", "public", ""),
    ("", "public", ""),
    ("trusted", "public", "is in zone trusted, which accepts everything"),
    ("", "trusted", "in no zone, so in the default zone trusted, which accepts everything"),
    ("internal", "public", "is in zone internal, but raymetal's rules go into firewall_firewalld_zone=public"),
])
def test_firewalld_refuses_a_fabric_interface_outside_its_zone_or_in_trusted(iface_zone, default, problem):
    found = fw.firewall_firewalld_zone_problem("ib0", iface_zone, default, "public")
    if not problem:
        assert found == ""
    else:
        assert problem in found and "Fix: firewall-cmd --permanent --zone=public --change-interface=ib0" in found
    assert fw.firewall_firewalld_zone_problem("any", "trusted", "trusted", "public") == ""
