"""Run raymetal's playbooks from Python, on top of ``ansible_runner.run``.

    from raymetal.runner import deploy, status, RaymetalError

    cluster = status("inventory/lab")
    print(cluster["nodes_alive"], cluster["totals"].get("GPU", 0))

Both :func:`deploy` and :func:`status` return the ``ray_cluster`` fact that the
playbooks publish with ``set_stats`` (see plugins/modules/ray_cluster_facts.py
for its fields). A failed run raises :class:`RaymetalError`, whose
``failures`` list names each failed or unreachable host, its task and Ansible's
message. Each run gets a temporary private data dir (extravars are written
there as ``env/extravars``) and uses this repository as its project dir, so
the repository's ansible.cfg, roles and plugins apply.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional

import ansible_runner

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE_PLAYBOOK = os.path.join(REPO, "site.yml")
STATUS_PLAYBOOK = os.path.join(REPO, "playbooks", "status.yml")
ACCEPTANCE_PLAYBOOK = os.path.join(REPO, "playbooks", "acceptance.yml")

EventCallback = Callable[[Dict[str, Any]], None]

_STATUS_BY_EVENT = {
    "runner_on_start": "started",
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
    "runner_item_on_failed": "failed",
}


class RaymetalError(Exception):
    """A raymetal playbook failed.

    Attributes:
        failures: one dict per failed or unreachable host: ``host``, ``play``,
            ``task``, ``msg`` and ``unreachable`` (bool).
        rc: exit status of ansible-playbook.
        status: ansible-runner's status (``failed``, ``timeout``, ...).
        stats: the ``set_stats`` data published before the failure ({} when none).
    """

    def __init__(self, message: str, failures: Optional[List[Dict[str, Any]]] = None,
                 rc: Optional[int] = None, status: Optional[str] = None,
                 stats: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.failures = failures or []
        self.rc = rc
        self.status = status
        self.stats = stats or {}


class AcceptanceFailed(RaymetalError):
    """playbooks/acceptance.yml judged at least one node FAIL; ``report`` holds the full report."""

    def __init__(self, message: str, report: Dict[str, Any], **kwargs):
        super().__init__(message, **kwargs)
        self.report = report


def _event_message(res: Dict[str, Any]) -> str:
    """The most useful one-line reason in an Ansible task result."""
    for key in ("msg", "stderr", "reason", "module_stderr", "stdout"):
        value = res.get(key)
        if value:
            return str(value).strip()
    results = res.get("results")
    if isinstance(results, list):
        return "; ".join(_event_message(r) for r in results if isinstance(r, dict) and r.get("failed"))
    return json.dumps(res, sort_keys=True)[:500]


def failures_from_events(events) -> List[Dict[str, Any]]:
    """Failed and unreachable hosts in ansible-runner events, leaving out ignored errors."""
    failures = []
    for event in events:
        kind = event.get("event")
        if kind not in ("runner_on_failed", "runner_on_unreachable"):
            continue
        data = event.get("event_data") or {}
        res = data.get("res") or {}
        if data.get("ignore_errors") or res.get("skip_reason"):
            continue
        failures.append({
            "host": data.get("host") or data.get("remote_addr"),
            "play": data.get("play"),
            "task": data.get("task"),
            "msg": _event_message(res),
            "unreachable": kind == "runner_on_unreachable",
        })
    return failures


def stats_data(events) -> Dict[str, Any]:
    """The ``set_stats`` data (non per-host) of a finished run, {} when none."""
    for event in events:
        if event.get("event") == "playbook_on_stats":
            return dict((event.get("event_data") or {}).get("artifact_data") or {})
    return {}


def progress(event: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Turn a runner event into {play, task, host, status} for progress displays (None if not a task result)."""
    status = _STATUS_BY_EVENT.get(event.get("event"))
    if status is None:
        return None
    data = event.get("event_data") or {}
    return {"play": data.get("play"), "task": data.get("task"), "host": data.get("host"),
            "status": status, "changed": bool((data.get("res") or {}).get("changed"))}


def _display(path: str) -> str:
    """A playbook path as users know it: relative to the repository when inside it."""
    inside = os.path.abspath(path).startswith(REPO + os.sep)
    return os.path.relpath(path, REPO) if inside else path


def _failure_message(playbook: str, failures: List[Dict[str, Any]], rc: Optional[int], stdout_tail: str) -> str:
    name = _display(playbook)
    if not failures:
        return "%s failed (rc=%s) without a task failure; output ends with:\n%s" % (name, rc, stdout_tail)
    lines = ["%s failed on %d host(s):" % (name, len(failures))]
    for item in failures:
        what = "UNREACHABLE" if item["unreachable"] else "task '%s'" % item["task"]
        lines.append("  %s: %s: %s" % (item["host"], what, item["msg"]))
    return "\n".join(lines)


def run_playbook(playbook: str, inventory: str, extravars: Optional[Dict[str, Any]] = None,
                 limit: Optional[str] = None, on_event: Optional[EventCallback] = None,
                 project_dir: str = REPO) -> Dict[str, Any]:
    """Run one playbook; return its set_stats data; raise RaymetalError if it fails.

    Args:
        playbook: path of the playbook (absolute, or relative to ``project_dir``).
        inventory: inventory file or directory (relative paths: from the current directory).
        extravars: extra variables, written to the private data dir as ``env/extravars``.
        limit: an Ansible host pattern (``--limit``).
        on_event: called with {play, task, host, status, changed} for each task result.
        project_dir: directory with ansible.cfg, roles and plugins (this repository).
    """
    inventory = os.path.abspath(inventory)
    if not os.path.exists(inventory):
        raise RaymetalError("inventory %s does not exist" % inventory)
    seen = []

    def handler(event):
        seen.append(event)
        if on_event is not None:
            item = progress(event)
            if item is not None:
                on_event(item)
        return True

    with tempfile.TemporaryDirectory(prefix="raymetal-run-") as private:
        os.makedirs(os.path.join(private, "env"))
        with open(os.path.join(private, "env", "extravars"), "w", encoding="utf-8") as fh:
            json.dump(extravars or {}, fh)
        envvars = {
            "ANSIBLE_CONFIG": os.path.join(project_dir, "ansible.cfg"),
            # ansible-playbook from the same environment as this Python, even if not on PATH.
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        }
        locale_now = os.environ.get("LC_ALL") or os.environ.get("LC_CTYPE") or os.environ.get("LANG") or ""
        if "utf-8" not in locale_now.lower().replace("utf8", "utf-8"):
            envvars["LC_ALL"] = "C.UTF-8"  # ansible-playbook refuses to start without a UTF-8 locale
        result = ansible_runner.run(
            private_data_dir=private, project_dir=project_dir, playbook=playbook,
            inventory=inventory, limit=limit, envvars=envvars, event_handler=handler,
            quiet=True, suppress_env_files=True,
            # ansible-runner's default is a jsonfile fact cache, which ansible-core 2.19 decodes again on every
            # task for every host: 60% more controller CPU on a full deploy of the lab (46 against 28 CPU-seconds).
            # The memory cache is what ansible.cfg gives ansible-playbook.
            fact_cache_type="memory")
        stdout_tail = ""
        if result.rc != 0:
            try:
                stdout_tail = result.stdout.read()[-2000:]
            except (OSError, ValueError, AttributeError):
                stdout_tail = "(no output kept)"
    if result.rc != 0 or result.status != "successful":
        failures = failures_from_events(seen)
        raise RaymetalError(_failure_message(playbook, failures, result.rc, stdout_tail),
                            failures=failures, rc=result.rc, status=result.status, stats=stats_data(seen))
    return stats_data(seen)


def _ray_cluster(data: Dict[str, Any], playbook: str) -> Dict[str, Any]:
    cluster = data.get("ray_cluster")
    if not isinstance(cluster, dict):
        raise RaymetalError("%s succeeded but published no ray_cluster stats (set_stats); got keys: %s"
                            % (_display(playbook), sorted(data)))
    return cluster


def deploy(inventory: str, extravars: Optional[Dict[str, Any]] = None, limit: Optional[str] = None,
           on_event: Optional[EventCallback] = None) -> Dict[str, Any]:
    """Run site.yml against ``inventory`` and return the ray_cluster fact of the deployed cluster.

    A deploy that went on without unreachable workers (``raymetal_max_unreachable``; ansible-playbook's exit
    status 4) returns the cluster too: its ``left_out`` maps each of those workers to the reason. Its
    ``unchanged`` lists the hosts that kept what the last deploy applied (the fast path: every host when nothing
    differed, else those the run left alone while the head and the hosts that differ converged). Any other
    failure raises :class:`RaymetalError`.
    """
    try:
        data = run_playbook(SITE_PLAYBOOK, inventory, extravars, limit, on_event)
    except RaymetalError as err:
        if not degraded_deploy(err):
            raise
        data = err.stats
    return _ray_cluster(data, SITE_PLAYBOOK)


def degraded_deploy(err: RaymetalError) -> bool:
    """Whether a failed site.yml run is a deploy that converged every node but the unreachable workers it left out
    on purpose: exit status 4, a published cluster whose ``left_out`` names every host that failed, and each of
    those failures an unreachable host."""
    cluster = err.stats.get("ray_cluster")
    if err.rc != 4 or not isinstance(cluster, dict) or not cluster.get("left_out"):
        return False
    left_out = set(cluster["left_out"])
    return bool(err.failures) and all(f.get("unreachable") and f.get("host") in left_out for f in err.failures)


def status(inventory: str, on_event: Optional[EventCallback] = None,
           require_all_alive: bool = False) -> Dict[str, Any]:
    """Run playbooks/status.yml (read-only) and return the ray_cluster fact.

    By default a cluster with hosts down is still a report: look at its ``missing``
    list (inventory hosts that are not an ALIVE Ray node). With
    ``require_all_alive=True`` such a cluster raises :class:`RaymetalError` instead
    (the playbook's exit status 2), naming the hosts.
    """
    extravars = None if require_all_alive else {"raymetal_status_report_only": True}
    return _ray_cluster(run_playbook(STATUS_PLAYBOOK, inventory, extravars, on_event=on_event), STATUS_PLAYBOOK)


def acceptance(inventory: str, extravars: Optional[Dict[str, Any]] = None, limit: Optional[str] = None,
               on_event: Optional[EventCallback] = None) -> Dict[str, Any]:
    """Run playbooks/acceptance.yml and return its report (see roles/acceptance/README.md).

    The report has ``nodes`` ({host: {verdict, findings, figures, versions}}), ``drift``, ``summary``,
    ``lines`` and ``report_path`` (the JSON file saved under the inventory). When a node fails, raises
    :class:`AcceptanceFailed` whose ``report`` is the same dict; other failures raise RaymetalError.
    """
    try:
        data = run_playbook(ACCEPTANCE_PLAYBOOK, inventory, extravars, limit, on_event)
    except RaymetalError as err:
        report = err.stats.get("acceptance")
        if isinstance(report, dict) and report.get("failed"):
            lines = [line for line in report.get("lines", []) if ": FAIL " in line]
            raise AcceptanceFailed("acceptance failed on %d node(s):\n  %s" % (len(lines), "\n  ".join(lines)),
                                   report, failures=err.failures, rc=err.rc, status=err.status,
                                   stats=err.stats) from None
        raise
    report = data.get("acceptance")
    if not isinstance(report, dict):
        raise RaymetalError("%s succeeded but published no acceptance stats (set_stats); got keys: %s"
                            % (_display(ACCEPTANCE_PLAYBOOK), sorted(data)))
    return report
