"""Filters about the offline wheelhouse (see roles/ray/files/ray_wheelhouse.py, playbooks/wheelhouse.yml)."""

from __future__ import annotations

import os
import re

# packaging is a dependency of ansible-core, so every controller has it. It is imported where a filter uses it,
# not when the file loads: Ansible loads every filter file of the collection in each task's worker process to
# find any one raymetal.cluster filter, and packaging's import was 9 % of a full deploy's controller CPU.
# The filters that need it call _need_packaging first, which names the missing package instead of a traceback.


def _need_packaging(filter_name):
    """Fail the filter, naming the Python package it needs, where packaging is missing."""
    try:
        import packaging.utils  # noqa: F401 pylint: disable=unused-import
    except ImportError as err:  # pragma: no cover - ansible-core itself requires packaging
        from ansible.errors import AnsibleFilterError
        raise AnsibleFilterError("%s needs the Python package 'packaging' on the controller: %s"
                                 % (filter_name, err))


def _python_release(version):
    """'3.13' or '3.13.5' -> (3, 13); ValueError for anything else."""
    parts = str(version).strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError("not a Python release: %r" % version)
    return int(parts[0]), int(parts[1])


def _accepted(release):
    """{(interpreter, abi)} that CPython `release` installs, whatever the platform."""
    from packaging import tags as _tags

    interpreter = "cp%d%d" % release
    accepted = set()
    for tag in _tags.cpython_tags(python_version=release, abis=[interpreter], platforms=["any"]):
        accepted.add((tag.interpreter, tag.abi))
    for tag in _tags.compatible_tags(python_version=release, interpreter=interpreter, platforms=["any"]):
        accepted.add((tag.interpreter, tag.abi))
    return accepted


def wheelhouse_for_python(filenames, python_version):
    """The wheels (and sdists) among filenames that CPython python_version can install."""
    _need_packaging("wheelhouse_for_python")
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    from packaging.version import InvalidVersion
    from ansible.errors import AnsibleFilterError

    try:
        accepted = _accepted(_python_release(python_version))
    except ValueError as err:
        raise AnsibleFilterError("wheelhouse_for_python: %s" % err)
    kept = []
    for path in filenames or []:
        name = os.path.basename(str(path))
        if name.startswith("."):
            continue
        if name.endswith((".tar.gz", ".zip")):
            kept.append(path)
            continue
        if not name.endswith(".whl"):
            continue
        try:
            wheel_tags = parse_wheel_filename(name)[3]
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if any((tag.interpreter, tag.abi) in accepted for tag in wheel_tags):
            kept.append(path)
    return kept


def wheelhouse_pythons(filenames, project):
    """Sorted 'X.Y' releases (or 'any') that the wheelhouse's files of project are built for."""
    _need_packaging("wheelhouse_pythons")
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename, parse_wheel_filename
    from packaging.version import InvalidVersion

    wanted = canonicalize_name(str(project))
    found = set()
    for path in filenames or []:
        name = os.path.basename(str(path))
        try:
            if name.endswith(".whl"):
                parsed = parse_wheel_filename(name)
                if canonicalize_name(parsed[0]) != wanted:
                    continue
                for tag in parsed[3]:
                    if tag.interpreter.startswith("cp") and tag.interpreter[2:].isdigit():
                        release = "%s.%s" % (tag.interpreter[2], tag.interpreter[3:])
                        found.add(release + "+" if tag.abi == "abi3" else release)
                    else:
                        found.add("any")
            elif name.endswith((".tar.gz", ".zip")) and canonicalize_name(parse_sdist_filename(name)[0]) == wanted:
                found.add("any")
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
    return sorted(found, key=lambda v: (v == "any", [int(p) for p in v.rstrip("+").split(".")] if v != "any" else [], v))


def _distributions(filenames):
    """{canonical project name: [versions]} of the wheels and sdists among filenames."""
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename, parse_wheel_filename
    from packaging.version import InvalidVersion

    found = {}
    for path in filenames or []:
        name = os.path.basename(str(path))
        try:
            if name.endswith(".whl"):
                project, version = parse_wheel_filename(name)[:2]
            elif name.endswith((".tar.gz", ".zip")):
                project, version = parse_sdist_filename(name)
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue
        found.setdefault(canonicalize_name(project), []).append(version)
    return found


def wheelhouse_missing(requirements, filenames):
    """Return the requirements (as given) that the wheelhouse files do not satisfy."""
    _need_packaging("wheelhouse_missing")
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    found = _distributions(filenames)
    missing = []
    for spec in requirements or []:
        try:
            req = Requirement(str(spec))
        except InvalidRequirement as err:
            missing.append("%s (not a pip requirement: %s)" % (spec, str(err).splitlines()[0]))
            continue
        versions = found.get(canonicalize_name(req.name), [])
        if not any(req.specifier.contains(v, prereleases=True) for v in versions):
            missing.append(str(spec))
    return missing


def wheelhouse_pip_source(install_source, fanout="mirror", is_mirror=False, mirror_ip="", mirror_port=8480,
                          wheelhouse_dir="", index_url=""):
    """{kind, args, where} of the pip run on one node (see wheelhouse_pip_source.yml)."""
    source = str(install_source)
    if source not in ("index", "wheelhouse", "path"):
        raise ValueError("ray_install_source=%r: expected index, wheelhouse or path" % (install_source,))
    if source == "index":
        args = ["--index-url", str(index_url)] if index_url else []
        return {"kind": "index", "args": args, "where": str(index_url) or "the index in pip's configuration"}
    # Wheels only (a source package would run its build code as root), and every file checked against the
    # sha256 in the requirements file (wheelhouse_hash_requirements) that the pip run is given.
    verified = ["--only-binary", ":all:", "--require-hashes"]
    if source == "path" or str(fanout) == "copy" or _truthy(is_mirror):
        return {"kind": "local", "args": ["--no-index", "--find-links", str(wheelhouse_dir)] + verified,
                "where": str(wheelhouse_dir)}
    if str(fanout) != "mirror":
        raise ValueError("ray_wheelhouse_fanout=%r: expected mirror or copy" % (fanout,))
    url = "http://%s:%d/" % (mirror_ip or "(no mirror address)", int(mirror_port))
    # pip refuses a plain-HTTP location unless it is a trusted host: the hashes, not the transport, vouch for
    # each file. --no-cache-dir keeps no second copy.
    return {"kind": "mirror", "args": ["--no-index", "--find-links", url, "--trusted-host", str(mirror_ip),
                                       "--no-cache-dir"] + verified, "where": url}


# Source distributions: pip would build them, running their setup code as root on the node.
SDIST_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar", ".zip", ".egg")


def wheelhouse_sdists(filenames):
    """The source distributions among filenames (base names, sorted): raymetal installs wheels only."""
    return sorted(set(os.path.basename(str(p)) for p in filenames or []
                      if not os.path.basename(str(p)).startswith(".")
                      and os.path.basename(str(p)).lower().endswith(SDIST_SUFFIXES)))


def _marker_env(python_version, machine):
    """The PEP 508 marker environment of a Linux CPython python_version (X.Y or X.Y.Z) on machine."""
    release = "%d.%d" % _python_release(python_version)
    full = str(python_version).strip() if str(python_version).count(".") >= 2 else release + ".0"
    return {"python_version": release, "python_full_version": full, "implementation_version": full,
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": str(machine),
            "platform_release": "", "platform_version": "", "extra": ""}


def _applies(req, env, extras=()):
    """Whether a requirement's marker holds on the node for any of the extras asked (or none)."""
    from packaging.markers import UndefinedComparison, UndefinedEnvironmentName

    if req.marker is None:
        return True
    for extra in [""] + sorted(extras):
        try:
            if req.marker.evaluate(dict(env, extra=extra)):
                return True
        except (UndefinedComparison, UndefinedEnvironmentName):
            return False
    return False


def _node_candidates(wheels, python_version, machine):
    """{project: {Version: [(file, info)]}} of the wheels that the node's Python and machine install."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import InvalidVersion, Version
    from ansible.errors import AnsibleFilterError

    accepted = _accepted(_python_release(python_version))
    full = Version(_marker_env(python_version, machine)["python_full_version"])
    found = {}
    for name, info in sorted((wheels or {}).items()):
        try:
            project, version, dummy, wheel_tags = parse_wheel_filename(os.path.basename(name))
        except (InvalidWheelFilename, InvalidVersion):
            continue
        if not any((t.interpreter, t.abi) in accepted and (t.platform == "any" or t.platform.endswith("_" + machine))
                   for t in wheel_tags):
            continue
        requires_python = str((info or {}).get("requires_python") or "")
        try:
            if requires_python and not SpecifierSet(requires_python).contains(full, prereleases=True):
                continue
        except InvalidSpecifier:
            pass
        if not (info or {}).get("sha256"):
            raise AnsibleFilterError("wheelhouse_hash_requirements: no sha256 for %s" % name)
        found.setdefault(canonicalize_name(project), {}).setdefault(version, []).append((name, info))
    return found


def _best(versions, asked):
    """The highest version of versions that every (Requirement, asker) of asked accepts, or None."""
    fitting = [v for v in versions if all(req.specifier.contains(v, prereleases=True) for req, dummy in asked)]
    return max(fitting) if fitting else None


def _requires(files, env, extras):
    """The requirements of one version (every wheel of it the node may take) that hold on the node."""
    from packaging.requirements import InvalidRequirement, Requirement

    found, seen = [], set()
    for dummy, info in files:
        for text in info.get("requires_dist") or []:
            try:
                req = Requirement(str(text))
            except InvalidRequirement:
                continue
            if str(req) not in seen and _applies(req, env, extras):
                seen.add(str(req))
                found.append(req)
    return found


def wheelhouse_hash_requirements(scan, requirements, python_version, machine="x86_64", where="the wheelhouse"):
    """The pip --require-hashes requirements file of one node (see wheelhouse_hash_requirements.yml)."""
    _need_packaging("wheelhouse_hash_requirements")
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from ansible.errors import AnsibleFilterError

    scan = scan or {}
    refused = wheelhouse_sdists(scan.get("refused") or [])
    if refused:
        raise AnsibleFilterError(
            "%s holds source distributions, which raymetal never installs (pip would build them, running their "
            "code as root on the node): %s. Fix: remove them and put wheels in their place (playbooks/wheelhouse.yml "
            "downloads wheels only)" % (where, ", ".join(refused)))
    problems = scan.get("problems") or {}
    if problems:
        raise AnsibleFilterError("%s holds wheels that cannot be read: %s. Fix: download them again" % (
            where, "; ".join("%s: %s" % item for item in sorted(problems.items()))))
    try:
        env = _marker_env(python_version, machine)
    except ValueError as err:
        raise AnsibleFilterError("wheelhouse_hash_requirements: %s" % err)
    candidates = _node_candidates(scan.get("wheels") or {}, python_version, machine)
    top = []
    for spec in requirements or []:
        try:
            req = Requirement(str(spec))
        except InvalidRequirement as err:
            raise AnsibleFilterError("%r is not a pip requirement: %s" % (spec, str(err).splitlines()[0]))
        if _applies(req, env):
            top.append(req)
    picks = {}
    # Highest version that every asker accepts, then again with the dependencies of those versions, until
    # nothing moves: the choice pip makes from a wheelhouse that pip download filled for these requirements.
    for dummy in range(len(candidates) + 2):
        asked, extras, expanded = {}, {}, {}
        queue = [(req, "the requirements") for req in top]
        while queue:
            req, asker = queue.pop(0)
            name = canonicalize_name(req.name)
            asked.setdefault(name, []).append((req, asker))
            extras.setdefault(name, set()).update(str(e).lower() for e in req.extras)
            version = picks.get(name)
            if version is None or not all(r.specifier.contains(version, prereleases=True) for r, a in asked[name]):
                version = _best(candidates.get(name, {}), asked[name])
            if version is None:
                continue
            key = (version, frozenset(extras[name]))
            if expanded.get(name) == key:
                continue
            expanded[name] = key
            queue.extend((dep, "%s %s" % (name, version))
                         for dep in _requires(candidates[name][version], env, extras[name]))
        chosen = {}
        missing = []
        for name, reqs in sorted(asked.items()):
            version = _best(candidates.get(name, {}), reqs)
            if version is None:
                have = sorted(candidates.get(name, {}))
                missing.append("%s (%s; the wheelhouse has %s for Python %s on %s)" % (
                    name, ", ".join("%s%s from %s" % (name, r.specifier or "", a) for r, a in reqs),
                    ", ".join(str(v) for v in have) or "no wheel", python_version, machine))
            else:
                chosen[name] = version
        if missing:
            raise AnsibleFilterError(
                "%s has no wheel that fits %s. Fix: rerun playbooks/wheelhouse.yml (or add those wheels)"
                % (where, "; ".join(missing)))
        if chosen == picks:
            break
        picks = chosen
    else:
        raise AnsibleFilterError("%s: the versions of %s never settled; pin them in ray_pip_packages"
                                 % (where, ", ".join(sorted(picks))))
    lines = ["# Written by raymetal (ray role) for pip --require-hashes: every package this node installs, pinned,",
             "# with the sha256 of each wheel of that version its Python may take, hashed in %s." % where]
    files = []
    for name in sorted(picks):
        version = picks[name]
        label = name + ("[%s]" % ",".join(sorted(extras[name])) if extras.get(name) else "")
        entries = candidates[name][version]
        files.extend(file for file, dummy in entries)
        hashes = sorted(set(info["sha256"] for dummy, info in entries))
        lines.append("%s==%s \\" % (label, version))
        lines.extend("    --hash=sha256:%s%s" % (h, " \\" if i < len(hashes) - 1 else "") for i, h in enumerate(hashes))
    return {"text": "\n".join(lines) + "\n", "pins": dict((name, str(v)) for name, v in sorted(picks.items())),
            "files": sorted(files)}


_MISMATCH_HEAD = "DO NOT MATCH THE HASHES"
_MISMATCH_FROM = re.compile(r"^\s*(?P<req>\S+) from (?P<url>\S+?)(?: \(from .*\))?:\s*$")
_MISMATCH_EXPECTED = re.compile(r"^\s*Expected\s+(?P<algo>\w+)\s+(?P<hash>[0-9a-f]+)\s*$")
_MISMATCH_GOT = re.compile(r"^\s*Got\s+(?P<hash>[0-9a-f]+)\s*$")


def pip_hash_mismatches(stderr):
    """[{requirement, url, file, expected, got}] for each file pip refused for its hash (see pip_hash_mismatches.yml)."""
    found = []
    current = None
    seen_head = False
    for line in str(stderr or "").splitlines():
        if _MISMATCH_HEAD in line:
            seen_head = True
            continue
        if not seen_head:
            continue
        match = _MISMATCH_FROM.match(line)
        if match:
            url = match.group("url")
            current = {"requirement": match.group("req"), "url": url, "file": url.rstrip("/").rsplit("/", 1)[-1],
                       "expected": [], "got": ""}
            found.append(current)
            continue
        if current is None:
            continue
        match = _MISMATCH_EXPECTED.match(line)
        if match:
            current["expected"].append(match.group("hash"))
            continue
        match = _MISMATCH_GOT.match(line)
        if match:
            current["got"] = match.group("hash")
    return found


def _truthy(value):
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


class FilterModule(object):
    """raymetal filters for the wheelhouse."""

    def filters(self):
        return {"wheelhouse_missing": wheelhouse_missing, "wheelhouse_for_python": wheelhouse_for_python,
                "wheelhouse_pythons": wheelhouse_pythons, "wheelhouse_pip_source": wheelhouse_pip_source,
                "wheelhouse_sdists": wheelhouse_sdists, "wheelhouse_hash_requirements": wheelhouse_hash_requirements,
                "pip_hash_mismatches": pip_hash_mismatches}
