"""Filters for a deploy that goes on around unreachable workers (raymetal_max_unreachable)."""

from __future__ import annotations

import re

from ansible.module_utils.parsing.convert_bool import boolean

# ASCII digits only: str.isdigit() and \d also take '²' (which int() refuses) and other scripts' digits.
_COUNT = re.compile(r"^\s*([0-9]+)\s*$")
_PERCENT = re.compile(r"^\s*([0-9]{1,3})\s*%\s*$")


def _why(message):
    """The useful part of Ansible's message for an unreachable host: ssh's own words where it has them."""
    text = " ".join(str(message or "").split())
    match = re.search(r".*(ssh: .*)$", text)
    return (match.group(1) if match else text)[:200] or "no answer"


def unreachable_budget(value, workers):
    """The number of workers a run may leave out: ``value`` is a count (``2``) or a share of the workers
    (``"10%"``, rounded down). Returns ``(count, problem)``; ``problem`` is '' when ``value`` is valid."""
    fix = ("Fix: set raymetal_max_unreachable to a whole number of workers (0 = every host must be reachable) "
           "or to a percentage of the workers such as '5%'.")
    if isinstance(value, bool):
        return 0, "raymetal_max_unreachable=%r is not a count or a percentage. %s" % (value, fix)
    if isinstance(value, int):
        if value < 0:
            return 0, "raymetal_max_unreachable=%d is negative. %s" % (value, fix)
        return value, ""
    text = str(value if value is not None else "")
    match = _COUNT.match(text)
    if match:
        return int(match.group(1)), ""
    match = _PERCENT.match(text)
    if match and int(match.group(1)) <= 100:
        return int(match.group(1)) * len(workers) // 100, ""
    return 0, "raymetal_max_unreachable=%r is not a count or a percentage. %s" % (value, fix)


def unreachable_budget_problem(value):
    """'' when ``value`` is a valid raymetal_max_unreachable (a count >= 0, or a percentage up to 100 %), else
    the message that stops the run: the variable, the value and the fix. Validation checks it on every run,
    before it contacts any host, whether or not the budget is needed that day."""
    return unreachable_budget(value, [])[1]


def unreachable_plan(unreachable, workers, budget, critical=None, allowed=True, addresses=None):
    """Decide what a run does with the hosts it could not reach.

    ``unreachable`` maps each unreachable host to Ansible's message; ``workers`` lists the inventory's
    workers; ``budget`` is raymetal_max_unreachable; ``critical`` maps the hosts no run may go on without
    (the head, the Redis host, the monitoring host, the wheelhouse mirror host) to what they serve;
    ``allowed`` is false for playbooks that never go on without a host; ``addresses`` maps hosts to their
    ansible_host, named in the messages.

    Returns ``{"left_out": {host: reason}, "refused": message}``: either the workers left out (refused is
    '') or the reason the run stops before any change (left_out is empty). A ``budget`` that is neither a
    count nor a percentage is refused whether or not a host is unreachable.
    """
    unreachable = dict(unreachable or {})
    critical = dict(critical or {})
    workers = list(workers or [])
    # A bad budget is refused on every run, not only on the day a host is unreachable and it is needed.
    count, problem = unreachable_budget(budget, workers)
    if problem:
        return {"left_out": {}, "refused": problem}
    if not unreachable:
        return {"left_out": {}, "refused": ""}
    names = sorted(unreachable)

    addresses = dict(addresses or {})

    def why(host):
        address = addresses.get(host) or ""
        return ("ansible_host=%s: " % address if address else "") + _why(unreachable[host])

    def listing(hosts):
        return "; ".join("%s (%s)" % (h, why(h)) for h in hosts)

    vital = [h for h in names if h in critical or h not in workers]
    if vital:
        roles = ", ".join("%s is %s" % (h, critical.get(h, "not a worker")) for h in vital)
        return {"left_out": {}, "refused": (
            "%d host(s) cannot be reached, so nothing was changed anywhere: %s. The run cannot go on without "
            "%s (%s). Fix: bring %s back (check SSH: ansible -i <inventory> -m ansible.builtin.ping %s)."
            % (len(names), listing(names), "it" if len(vital) == 1 else "them", roles,
               "it" if len(vital) == 1 else "them", " ".join(vital)))}
    if not allowed or len(names) > count:
        over = ("The budget (raymetal_max_unreachable=%s) allows %d of the %d worker(s) to be left out"
                % (budget, count, len(workers)) if allowed else "This playbook needs every host")
        hint = ("bring them back, remove them from the inventory, or raise raymetal_max_unreachable"
                if allowed else "bring them back or remove them from the inventory")
        return {"left_out": {}, "refused": (
            "%d host(s) cannot be reached, so nothing was changed anywhere: %s. %s. Fix: check SSH to those "
            "hosts (ansible -i <inventory> -m ansible.builtin.ping <host>), then %s."
            % (len(names), listing(names), over, hint))}
    return {"left_out": {h: "unreachable (%s)" % why(h) for h in names}, "refused": ""}


def _bound_address(hostvars, host):
    """The fabric address this run bound Ray to on ``host`` (``ray_node_ip`` without a prefix length), or ''."""
    hvars = hostvars[host] if host in hostvars else {}
    return str(hvars.get("ray_node_ip") or "").split("/", 1)[0]


def role_converges(probe, role, digest):
    """Whether ``role`` runs on a host that takes the full path: False only when the fast path's probe of the host
    (``probe``, the applied_state result) found raymetal's code, the inventory's files and every watched state the
    same as its record, and the record holds ``digest`` for ``role`` (the role_inputs lookup's digest of the role's
    inputs, resolved where the role runs). Anything else (no probe: the fast path off, tags, the acceptance gate;
    no record; a record from before the full path per role) runs the role."""
    if not isinstance(probe, dict) or not probe.get("code_same") or not probe.get("state_same"):
        return True
    applied = probe.get("applied")
    recorded = applied.get("raymetal_role_inputs") if isinstance(applied, dict) else None
    if not isinstance(recorded, dict) or not digest:
        return True
    return recorded.get(role) != digest


# The hosts pattern of a play that applies a role on no host (playbooks/tasks/role_hosts.yml): ray_head and ray_worker
# never share a host (validation refuses it).
NO_HOST = "ray_head:&ray_worker"


def role_hosts(hosts, hostvars, roles, all_or_none=None, patterns=False):
    """{role: the hosts of ``hosts`` where it runs} for each of ``roles``, from each host's
    ``raymetal_role_runs_<role>`` (the role_converges filter's answer there; a host without it runs the role). A role
    in ``all_or_none`` runs on every host of ``hosts`` where it runs on one (its run on one host reads what it finds
    on the others in the same run), else on none. With ``patterns``, {role: the hosts pattern of the play that
    applies it}: its group ``raymetal_role_<role>``, or a pattern that matches no host."""
    plan = _role_hosts(hosts, hostvars, roles, all_or_none)
    if patterns:
        return {role: ("raymetal_role_" + str(role)) if runs else NO_HOST for role, runs in plan.items()}
    return plan


def _role_hosts(hosts, hostvars, roles, all_or_none):
    hosts = list(hosts or [])
    together = set(all_or_none or [])
    plan = {}
    for role in roles or []:
        key = "raymetal_role_runs_" + str(role)
        runs = [h for h in hosts if boolean(((hostvars[h] if h in hostvars else {}) or {}).get(key, True), strict=False)]
        plan[role] = list(hosts) if runs and role in together else runs
    return plan


def fast_path_plan(hosts, hostvars, head, stale, recorded):
    """Which of this deploy's hosts take the full path (the fast path per host).

    ``hosts``: the hosts the deploy converges (every cluster host but the unreachable workers left out);
    ``stale``: those whose record differs (playbooks/fast_path.yml); ``recorded``: {host: the fabric address its
    record holds}. The head and the hosts that differ take the full path; every other host keeps what the last
    deploy applied. Every host takes it when the head differs, or when a host's fabric address is not the one
    recorded (or it has no record: a new node), since every firewall then has to learn the address.
    Returns {"converge": [...], "unchanged": [...], "everywhere": the reason, or '' when none is needed}.
    """
    hosts = list(hosts or [])
    stale = set(stale or [])
    recorded = recorded or {}

    def everywhere(why):
        return {"converge": hosts, "unchanged": [], "everywhere": why}

    unchanged = [h for h in hosts if h not in stale and h != head]
    if not unchanged:
        return everywhere("")
    if head in stale:
        return everywhere("the head differs from what the last deploy applied")
    for host in hosts:
        address = _bound_address(hostvars, host)
        before = str(recorded.get(host) or "")
        if not before:
            return everywhere("%s has no record of an earlier deploy (a new node): every firewall must admit it" % host)
        if address != before:
            return everywhere("%s's fabric address is %s, recorded %s: every firewall must learn it"
                              % (host, address or "unknown", before))
    return {"converge": [h for h in hosts if h not in unchanged], "unchanged": unchanged, "everywhere": ""}


def exclude_pattern(pattern, hosts):
    """A host pattern that is ``pattern`` without ``hosts`` (``ray_cluster:!w3:!w7``)."""
    return ":".join([pattern] + ["!" + h for h in sorted(hosts or [])])


def cluster_members(hosts, hostvars):
    """{host: {"address": fabric IP, "ray_ports": [...]}} for the hosts whose address this run knows: what the
    head records after a deploy, so that a later run that leaves a worker out keeps its address and ports."""
    members = {}
    for host in hosts or []:
        address = _bound_address(hostvars, host)
        if address:
            members[host] = {"address": address, "ray_ports": list(hostvars[host].get("ray_ports") or [])}
    return members


def health_quarantined(hosts, hostvars):
    """{host: reason} for the hosts whose health loop holds a quarantine record (``health_quarantine``, which the
    health role's ``state`` entry point publishes): the deploy keeps Ray stopped there and names them."""
    held = {}
    for host in hosts or []:
        record = (hostvars[host] if host in hostvars else {}).get("health_quarantine") or {}
        if record:
            held[host] = "quarantined by the health loop (%s, %s): %s" % (
                record.get("class") or "?", record.get("check") or "?", record.get("finding") or "no finding recorded")
    return held


class FilterModule:
    """Degraded-mode deploy filters."""

    def filters(self):
        return {
            "unreachable_plan": unreachable_plan,
            "unreachable_budget_problem": unreachable_budget_problem,
            "exclude_pattern": exclude_pattern,
            "fast_path_plan": fast_path_plan,
            "role_converges": role_converges,
            "role_hosts": role_hosts,
            "cluster_members": cluster_members,
            "health_quarantined": health_quarantined,
        }
