"""Whether Ray's cgroup v2 resource isolation can run on a node, and why not."""

from __future__ import annotations


MIN_KERNEL = (5, 8)
MIN_RESERVED_CPU = 1.0
MIN_RESERVED_MEMORY = 500 * 1024 ** 2
CONTROLLERS = ("cpu", "memory")


def _kernel_tuple(release):
    parts = []
    for piece in str(release or "").split("-", 1)[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (2 - len(parts)))


def _setting(value):
    """'auto', 'on', 'off', or None for a value that is none of them."""
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if text in ("true", "yes", "on", "1"):
        return "on"
    return "off" if text in ("false", "no", "off", "0") else None


def _gib(num):
    return "%.1f GiB" % (num / 1024.0 ** 3)


def ray_isolation_plan(node, setting="auto", reserved_cpu=None, reserved_memory=None):
    """{enabled, reason, problem} of Ray's resource isolation on one node (see ray_isolation_plan.yml)."""
    node = node or {}
    mode = _setting(setting)
    if mode is None:
        return {"enabled": False, "reason": "off: ray_resource_isolation=%r is not auto, true or false" % (setting,),
                "problem": "ray_resource_isolation=%r is not auto, true or false. Fix: set it to one of those."
                           % (setting,)}
    if mode == "off":
        return {"enabled": False, "reason": "off (ray_resource_isolation: false)", "problem": ""}
    cpus = float(node.get("cpus") or 0)
    memory = int(node.get("memory_bytes") or 0)
    missing = [c for c in CONTROLLERS if c not in (node.get("controllers") or [])]
    why_not = ""
    if not node.get("cgroup2"):
        why_not = ("cgroup v1 (or hybrid) at /sys/fs/cgroup, Ray's isolation needs cgroup v2 alone "
                   "(systemd.unified_cgroup_hierarchy=1)")
    elif _kernel_tuple(node.get("kernel")) < MIN_KERNEL:
        why_not = "kernel %s is older than 5.8" % node.get("kernel")
    elif missing:
        why_not = "the %s controller%s not available in /sys/fs/cgroup" % (
            " and ".join(missing), "s are" if len(missing) > 1 else " is")
    elif cpus < 2:
        why_not = "%g CPU: Ray reserves at least 1 core for its own processes and needs more than that" % cpus
    if why_not:
        problem = ""
        if mode == "on":
            problem = ("ray_resource_isolation is true but this node cannot isolate Ray's processes: %s. Fix: set "
                       "ray_resource_isolation to auto (on where the node can) or false for this host." % why_not)
        return {"enabled": False, "reason": "off: " + why_not, "problem": problem}
    problems = []
    if reserved_cpu is not None and not MIN_RESERVED_CPU <= float(reserved_cpu) < cpus:
        problems.append("ray_system_reserved_cpu=%s must be at least 1 and below the node's %g CPUs"
                        % (reserved_cpu, cpus))
    if reserved_memory is not None and not MIN_RESERVED_MEMORY <= int(reserved_memory) < memory:
        problems.append("ray_system_reserved_memory=%s must be at least 524288000 (500 MiB) and below the node's "
                        "%d bytes" % (reserved_memory, memory))
    if problems:
        return {"enabled": False, "reason": "off: " + "; ".join(problems),
                "problem": "Ray would refuse its resource isolation settings: %s. Fix: change them, or leave them "
                           "null to let Ray size them from the node." % "; ".join(problems)}
    cpu_text = ("%g cores" % float(reserved_cpu)) if reserved_cpu is not None else "Ray's default cores"
    mem_text = _gib(int(reserved_memory)) if reserved_memory is not None else "Ray's default memory"
    return {"enabled": True, "reason": "on: %s and %s reserved for Ray's own processes" % (cpu_text, mem_text),
            "problem": ""}


def ray_isolation_by_host(hostvars, hosts):
    """{host: plan} for the hosts whose plan this run decided (preflight ran there), or the last deploy
    recorded (the fast path gives it back as a fact when nothing changed since)."""
    found = {}
    for host in hosts or []:
        hvars = hostvars.get(host) or {}
        plan = hvars.get("ray_resource_isolation_plan") or (hvars.get("ansible_facts") or {}).get(
            "ray_resource_isolation_plan")
        if plan:
            found[host] = dict(plan)
    return found


def ray_isolation_lines(hostvars, hosts):
    """Summary lines: which hosts run Ray with resource isolation, and why the others do not."""
    on, off = [], {}
    for host, plan in ray_isolation_by_host(hostvars, hosts).items():
        if plan.get("enabled"):
            on.append(host)
        else:
            off.setdefault(plan.get("reason") or "off", []).append(host)
    if not on and not off:
        return []
    lines = ["Resource isolation (cgroup v2, Ray's system processes protected from jobs):"]
    if on:
        lines.append("  on: " + ", ".join(sorted(on)))
    for reason in sorted(off):
        lines.append("  %s: %s" % (", ".join(sorted(off[reason])), reason))
    return lines


class FilterModule:
    """Ray resource isolation filters."""

    def filters(self):
        return {
            "ray_isolation_plan": ray_isolation_plan,
            "ray_isolation_lines": ray_isolation_lines,
            "ray_isolation_by_host": ray_isolation_by_host,
        }
