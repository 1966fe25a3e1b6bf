"""Filters shared by raymetal's roles and playbooks."""

from __future__ import annotations


def _as_port(value):
    try:
        port = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return port


def port_problems(ports, min_worker_port, max_worker_port, low=1024, high=65535):
    """Return human-readable problems with a set of named ports.

    ``ports`` maps variable names to port values. Checks: each is an integer in
    [low, high]; no two variables share a port; none falls inside the worker
    port range [min_worker_port, max_worker_port]; the range itself is valid.
    """
    problems = []
    owners = {}
    for name in sorted(ports):
        port = _as_port(ports[name])
        if port is None:
            problems.append("%s=%r is not a port number" % (name, ports[name]))
            continue
        if not low <= port <= high:
            problems.append("%s=%d is outside %d-%d" % (name, port, low, high))
            continue
        owners.setdefault(port, []).append(name)
    lo, hi = _as_port(min_worker_port), _as_port(max_worker_port)
    if lo is None or hi is None or not (low <= lo < hi <= high):
        problems.append(
            "worker port range %s-%s is invalid (need %d <= min < max <= %d)"
            % (min_worker_port, max_worker_port, low, high)
        )
        lo = hi = None
    for port in sorted(owners):
        names = owners[port]
        if len(names) > 1:
            problems.append("port %d is used by %s" % (port, " and ".join(names)))
        if lo is not None and lo <= port <= hi:
            problems.append(
                "%s=%d is inside the worker port range %d-%d" % (names[0], port, lo, hi)
            )
    return problems


def ipv4_by_interface(facts):
    """Summarise a host's IPv4 addresses as 'ib0=10.0.0.1/24, eth0=...'.

    ``facts`` is ``ansible_facts`` with network facts gathered.
    """
    parts = []
    for name in sorted(facts.get("interfaces", [])):
        info = facts.get(name.replace("-", "_"), {})
        ipv4 = info.get("ipv4") if isinstance(info, dict) else None
        if ipv4 and ipv4.get("address"):
            parts.append("%s=%s/%s" % (name, ipv4["address"], ipv4.get("prefix", "?")))
    return ", ".join(parts) if parts else "none"


def interface_of_ipv4(facts, address):
    """Name of the interface that carries IPv4 ``address`` (primary or secondary), '' when none does.

    ``facts`` is ``ansible_facts`` with network facts gathered.
    """
    if not address:
        return ""
    for name in sorted(facts.get("interfaces", [])):
        info = facts.get(name.replace("-", "_"), {})
        if not isinstance(info, dict):
            continue
        candidates = [info.get("ipv4") or {}] + list(info.get("ipv4_secondaries") or [])
        if any(isinstance(c, dict) and c.get("address") == address for c in candidates):
            return name
    return ""


def node_software_lines(hosts, hostvars, unchanged=None):
    """One line per host: NCCL version, GPU count and driver version.

    Reads what the nccl and nvidia_driver roles left in hostvars; says
    'not verified' / 'none' where they found nothing. The hosts in
    ``unchanged`` took the fast path (the roles did not run there): their line says so.
    """
    lines = []
    unchanged = set(unchanged or [])
    for host in hosts or []:
        if host in unchanged:
            lines.append("%s: unchanged since the last deploy (fast path)" % host)
            continue
        hvars = hostvars[host] if host in hostvars else {}
        facts = hvars.get("ansible_facts") or {}
        gpus = (facts.get("nvidia_gpu") or {}).get("count", 0)
        driver = (facts.get("nvidia_driver") or {}).get("driver_version") or "none"
        nccl = hvars.get("nccl_version") or "not verified"
        lines.append("%s: NCCL %s, %s GPU(s), driver %s" % (host, nccl, gpus, driver))
    return lines


def _flag(value, default):
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


def os_problems(hosts, hostvars, supported_families):
    """{host: problem} for the hosts whose OS raymetal cannot deploy on (see os_problems.yml)."""
    problems = {}
    for host in hosts or []:
        hvars = hostvars[host] if host in hostvars else {}
        if (hvars.get("__validate_setup") or {}).get("unreachable"):
            continue
        facts = hvars.get("ansible_facts") or {}
        service_mgr = facts.get("service_mgr") or "unknown"
        family = facts.get("os_family") or "unknown"
        if service_mgr != "systemd" and _flag(hvars.get("raymetal_validate_require_systemd"), True):
            problems[host] = "service manager is %s, not systemd" % service_mgr
        elif family not in list(supported_families) and not _flag(hvars.get("raymetal_allow_unsupported_os"), False):
            problems[host] = "%s %s (%s family) is not supported" % (
                facts.get("distribution") or "unknown", facts.get("distribution_version") or "", family)
    return problems


# Directories two levels deep that hold the system's or other programs' files: never raymetal's.
_SYSTEM_DIRS = frozenset("""
/etc/systemd /etc/default /etc/security /etc/apt /etc/yum.repos.d /etc/ssh /etc/ssl /etc/pki /etc/sudoers.d
/usr/bin /usr/sbin /usr/lib /usr/lib64 /usr/libexec /usr/local /usr/share /usr/include /usr/src
/var/lib /var/log /var/cache /var/tmp /var/spool /var/opt /var/mail /var/backups /var/www /var/run /var/lock
/run/user /boot/efi
""".split())


def removal_path_problems(paths):
    """[sentence] for each path raymetal must not remove (plugins/filter/removal_path_problems.yml)."""
    problems = []
    for var, path in (paths or {}).items():
        text = "" if path is None else str(path)
        parts = [p for p in text.split("/") if p not in ("", ".")]
        normal = "/" + "/".join(parts)
        why = None
        if not text.startswith("/"):
            why = "is not an absolute path"
        elif ".." in parts:
            why = "contains '..'"
        elif len(parts) < 2:
            why = "is the root or a top-level directory of the system"
        elif normal in _SYSTEM_DIRS:
            why = "is a system directory"
        elif (parts[0] == "home" and len(parts) == 2) or parts[0] == "root":
            why = "is a user's home"
        if why:
            problems.append(
                "%s=%s %s, and raymetal removes it as root (teardown, or a switch of fault tolerance): it must be "
                "a directory of raymetal's own. Fix: keep the default or choose a new directory at least two levels "
                "deep, such as /var/lib/ray/gcs or /srv/raymetal/NAME" % (var, text, why))
    return problems


class FilterModule:
    """raymetal filters."""

    def filters(self):
        return {
            "port_problems": port_problems,
            "ipv4_by_interface": ipv4_by_interface,
            "interface_of_ipv4": interface_of_ipv4,
            "node_software_lines": node_software_lines,
            "os_problems": os_problems,
            "removal_path_problems": removal_path_problems,
        }
