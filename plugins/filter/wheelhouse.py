"""Filters about the offline wheelhouse (see raymetal/wheelhouse.py, playbooks/wheelhouse.yml)."""

from __future__ import annotations

import os

# packaging is a dependency of ansible-core, so every controller has it; the guard lets the filters
# load (as ansible-test's import check demands) and name the missing package only when one is used.
try:
    from packaging import tags as _tags
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name,
                                 parse_sdist_filename, parse_wheel_filename)
    from packaging.version import InvalidVersion
except ImportError as err:  # pragma: no cover - ansible-core itself requires packaging
    PACKAGING_IMPORT_ERROR = err
else:
    PACKAGING_IMPORT_ERROR = None


def _need_packaging(filter_name):
    """Fail the filter, naming the Python package it needs, where packaging is missing."""
    if PACKAGING_IMPORT_ERROR is not None:
        from ansible.errors import AnsibleFilterError
        raise AnsibleFilterError("%s needs the Python package 'packaging' on the controller: %s"
                                 % (filter_name, PACKAGING_IMPORT_ERROR))


def _python_release(version):
    """'3.13' or '3.13.5' -> (3, 13); ValueError for anything else."""
    parts = str(version).strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError("not a Python release: %r" % version)
    return int(parts[0]), int(parts[1])


def _accepted(release):
    """{(interpreter, abi)} that CPython `release` installs, whatever the platform."""
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
    if source == "path" or str(fanout) == "copy" or _truthy(is_mirror):
        return {"kind": "local", "args": ["--no-index", "--find-links", str(wheelhouse_dir)],
                "where": str(wheelhouse_dir)}
    if str(fanout) != "mirror":
        raise ValueError("ray_wheelhouse_fanout=%r: expected mirror or copy" % (fanout,))
    url = "http://%s:%d/" % (mirror_ip or "(no mirror address)", int(mirror_port))
    # pip refuses a plain-HTTP location unless it is a trusted host; --no-cache-dir keeps no second copy.
    return {"kind": "mirror", "args": ["--no-index", "--find-links", url, "--trusted-host", str(mirror_ip),
                                       "--no-cache-dir"], "where": url}


def _truthy(value):
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


class FilterModule(object):
    """raymetal filters for the wheelhouse."""

    def filters(self):
        return {"wheelhouse_missing": wheelhouse_missing, "wheelhouse_for_python": wheelhouse_for_python,
                "wheelhouse_pythons": wheelhouse_pythons, "wheelhouse_pip_source": wheelhouse_pip_source}
