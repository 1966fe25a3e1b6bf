"""Filters about the offline wheelhouse (see raymetal/wheelhouse.py, playbooks/wheelhouse.yml)."""

from __future__ import annotations

import os

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name,
                             parse_sdist_filename, parse_wheel_filename)
from packaging.version import InvalidVersion

DOCUMENTATION_WHEELHOUSE_MISSING = """
name: wheelhouse_missing
short_description: The requirements that no file in a wheelhouse satisfies
description:
  - Takes pip requirement specifiers (C(ray[default]==2.60.0), C(numpy==2.4.6), C(torch))
    and the file names in a wheelhouse directory; returns, in order, each requirement for
    which no wheel or sdist of that project with an allowed version is there.
  - Looks at the named packages only, not at their dependencies (pip reports those).
  - An unparseable requirement is returned as missing, with the reason.
"""


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


class FilterModule(object):
    """raymetal filters for the wheelhouse."""

    def filters(self):
        return {"wheelhouse_missing": wheelhouse_missing}
