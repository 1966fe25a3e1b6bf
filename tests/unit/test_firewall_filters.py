"""Unit tests for plugins/filter/firewall.py (validation and rule planning)."""

from __future__ import annotations

import pathlib

import pytest

from ansible_collections.raymetal.cluster.plugins.filter import firewall as fw

ROOT = pathlib.Path(__file__).resolve().parents[2]

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
    assert rich == [
        'rule family="ipv4" source address="10.231.20.10" port port="6379" protocol="tcp" accept',
        'rule family="ipv6" source address="fd00::7" port port="6379" protocol="tcp" accept',
        'rule family="ipv4" source address="10.231.20.10" port port="10002-19999" protocol="tcp" accept',
        'rule family="ipv6" source address="fd00::7" port port="10002-19999" protocol="tcp" accept',
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
