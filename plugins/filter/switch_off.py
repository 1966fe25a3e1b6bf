"""raymetal filters for switching a service off: one read-only probe per host, then a plan of what to stop and remove.

A component (a service a role runs where a switch says so) is described by a dict:
  name      what the role calls it (node_exporter, prometheus, wheelhouse_mirror, ...)
  wanted    whether this host should run it now (the role's switches)
  units     systemd units to stop and disable
  owned     files and directories only raymetal creates: their presence says raymetal set the service up here
  written   {path: text}: a file the package ships that raymetal rewrote; it counts (and goes) only when it holds text
  dropins   raymetal's drop-in files (.../NAME.service.d/raymetal.conf): a marker too; their directory goes with
            them when nothing else is in it

A component that is not wanted and carries none of these markers was never set up by raymetal here: the plan leaves
it alone, whatever runs under its unit's name.
"""

from __future__ import annotations

import posixpath
import shlex

_ENABLED = ("enabled", "enabled-runtime", "linked", "linked-runtime")
_RUNNING = ("active", "activating", "reloading", "deactivating")


def _rooted(root, path):
    return (str(root).rstrip("/") + path) if root else path


def _unwanted(components):
    return [c for c in components or [] if not _truthy(c.get("wanted"))]


def _truthy(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def switch_off_probe(components, root=""):
    """The shell script that reads, in one run, the markers and unit states of every component not wanted."""
    lines = []
    for comp in _unwanted(components):
        for unit in comp.get("units") or []:
            lines.append(
                "u=%s; e=$(systemctl is-enabled \"$u\" 2>/dev/null); a=$(systemctl is-active \"$u\" 2>/dev/null);"
                " echo \"unit $u ${e:--} ${a:--}\"" % shlex.quote(unit))
        for path in list(comp.get("owned") or []) + list(comp.get("dropins") or []):
            where = _rooted(root, path)
            lines.append("if [ -e %s ]; then echo %s; fi" % (shlex.quote(where), shlex.quote("exists " + where)))
        for path, text in sorted((comp.get("written") or {}).items()):
            where = _rooted(root, path)
            lines.append("if grep -qsF -e %s %s; then echo %s; fi"
                         % (shlex.quote(text), shlex.quote(where), shlex.quote("ours " + where)))
        for path in comp.get("dropins") or []:
            where = _rooted(root, path)
            folder = posixpath.dirname(where)
            lines.append(
                "if [ -n \"$(find %s -mindepth 1 -maxdepth 1 ! -name %s 2>/dev/null | head -n 1)\" ]; then echo %s; fi"
                % (shlex.quote(folder), shlex.quote(posixpath.basename(where)), shlex.quote("others " + folder)))
    return "\n".join(lines + ["true"]) + "\n"


def switch_off_plan(probe_lines, components, root=""):
    """{components, units, paths, daemon_reload}: what to stop, disable and remove, from switch_off_probe's output.

    units: [{unit, stop, disable}] for the units of components set up by raymetal that still run or start at boot;
    paths: the files and directories of those components to remove (rooted); components: their names.
    """
    states, exists, ours, others = {}, set(), set(), set()
    for line in probe_lines or []:
        kind, _sep, rest = str(line).partition(" ")
        if kind == "unit":
            fields = rest.split()
            if len(fields) == 3:
                states[fields[0]] = (fields[1], fields[2])
        elif kind == "exists":
            exists.add(rest)
        elif kind == "ours":
            ours.add(rest)
        elif kind == "others":
            others.add(rest)
    plan = {"components": [], "units": [], "paths": [], "daemon_reload": False}
    for comp in _unwanted(components):
        owned = [_rooted(root, p) for p in comp.get("owned") or []]
        dropins = [_rooted(root, p) for p in comp.get("dropins") or []]
        written = [_rooted(root, p) for p in sorted((comp.get("written") or {}).keys())]
        found = [p for p in owned + dropins if p in exists] + [p for p in written if p in ours]
        if not found:
            continue
        plan["components"].append(comp.get("name", ""))
        for unit in comp.get("units") or []:
            enabled, active = states.get(unit, ("-", "-"))
            stop, disable = active in _RUNNING, enabled in _ENABLED
            if stop or disable:
                plan["units"].append({"unit": unit, "stop": stop, "disable": disable})
        paths = list(found)
        for dropin in dropins:
            folder = posixpath.dirname(dropin)
            if folder not in others and dropin in exists:
                paths.append(folder)
        for path in paths:
            if path not in plan["paths"]:
                plan["paths"].append(path)
    plan["daemon_reload"] = any("/etc/systemd/system/" in p for p in plan["paths"])
    return plan


class FilterModule:
    """raymetal filters for switching services off."""

    def filters(self):
        return {
            "switch_off_probe": switch_off_probe,
            "switch_off_plan": switch_off_plan,
        }
