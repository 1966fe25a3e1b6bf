"""raymetal filters for the shared storage every node mounts (raymetal_shared_storage).

``raymetal_shared_storage`` is one dict in the inventory; these filters are the one place that reads it:
``shared_storage_problems`` says what is wrong with it (for the preflight's message), ``shared_storage_settings``
turns a valid one into the settings the roles use, with the defaults filled in.

Kinds:
  none   (or the variable absent) nothing, and what raymetal mounted before is unmounted and removed
  mount  a site's shared filesystem (NFS, Lustre, GPFS, CephFS, ...) mounted at the same path on every node by a
         systemd mount unit: source, fstype, options, path, packages
"""

from __future__ import annotations

import posixpath
import re

KINDS = ("none", "mount")
DEFAULT_PATH = "/mnt/ray-shared"
DEFAULT_OPTIONS = "defaults"
# The client packages each filesystem type needs on Debian and Ubuntu. Lustre's and GPFS's come from the vendor
# (the site's mirror carries them under its own names): set `packages` for them.
CLIENT_PACKAGES = {
    "nfs": ["nfs-common"],
    "nfs4": ["nfs-common"],
    "ceph": ["ceph-common"],
    "glusterfs": ["glusterfs-client"],
    "cifs": ["cifs-utils"],
}
KEYS = ("kind", "source", "fstype", "options", "path", "packages")
# What the mount unit's name and Ray's unit accept without systemd's escaping rules beyond '-' (the escape of
# every other byte would be needed): letters, digits, '_', '.', '-' and '/'.
_PATH_RE = re.compile(r"^(/[A-Za-z0-9_.][A-Za-z0-9_.-]*)+$")
_SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/mnt", "/opt", "/proc", "/root",
                "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/tmp", "/media"}
_VAR = "raymetal_shared_storage"


def _spec(value):
    if value is None or value == "":
        return {"kind": "none"}
    return value


def shared_storage_problems(value):
    """Human-readable problems with ``raymetal_shared_storage`` (empty when it is valid)."""
    spec = _spec(value)
    if not isinstance(spec, dict):
        return ["%s must be a dict such as {kind: mount, source: 'nfs01:/export/ray', fstype: nfs}, not %r. "
                "Fix: set it as a dict, or leave it out for no shared storage" % (_VAR, spec)]
    problems = []
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        problems.append("%s has unknown key(s) %s. Fix: use only %s" % (_VAR, ", ".join(unknown), ", ".join(KEYS)))
    kind = spec.get("kind", "none")
    if kind not in KINDS:
        return problems + ["%s.kind=%r is not one of %s. Fix: kind: mount for a site's shared filesystem, or none"
                           % (_VAR, kind, ", ".join(KINDS))]
    if kind == "none":
        return problems
    for key in ("source", "fstype"):
        if not str(spec.get(key) or "").strip():
            problems.append("%s.kind is mount but %s.%s is empty. Fix: set %s (e.g. %s)" % (
                _VAR, _VAR, key, key, "source: 'nfs01:/export/ray'" if key == "source" else
                "fstype: nfs, lustre, gpfs or ceph"))
    for key in ("source", "fstype", "options"):
        text = str(spec.get(key) or "")
        if any(ch in text for ch in "\n\r") or (key != "source" and any(ch.isspace() for ch in text)):
            problems.append("%s.%s=%r contains whitespace or a line break, which a mount unit cannot carry. Fix: "
                            "write the options comma-separated, without spaces" % (_VAR, key, text))
    path = str(spec.get("path") or DEFAULT_PATH)
    normal = posixpath.normpath(path)
    if not _PATH_RE.match(path) or ".." in path.split("/"):
        problems.append("%s.path=%r is not an absolute path of letters, digits, '_', '.', '-' and '/'. Fix: choose "
                        "such a path, e.g. %s" % (_VAR, path, DEFAULT_PATH))
    elif normal in _SYSTEM_DIRS or normal.split("/")[1] in ("proc", "sys", "dev", "run", "boot", "etc", "usr"):
        problems.append("%s.path=%s is a system directory: raymetal mounts over it and unmounts it. Fix: choose a "
                        "directory of its own, e.g. %s" % (_VAR, path, DEFAULT_PATH))
    packages = spec.get("packages")
    if packages is not None and not (isinstance(packages, list) and all(isinstance(p, str) for p in packages)):
        problems.append("%s.packages=%r is not a list of package names. Fix: e.g. packages: [nfs-common]"
                        % (_VAR, packages))
    return problems


def mount_unit_name(path):
    """The systemd mount unit for ``path`` (what ``systemd-escape --path --suffix=mount`` prints, for the paths
    shared_storage_problems accepts)."""
    parts = posixpath.normpath(path).strip("/").split("/")
    return "-".join(part.replace("-", "\\x2d") for part in parts) + ".mount"


def shared_storage_settings(value):
    """The settings of a valid ``raymetal_shared_storage``, defaults filled in.

    {kind, source, fstype, options, path, packages, unit, ray_path}: ``unit`` is the mount unit's name ('' for
    none), ``ray_path`` the path Ray's processes are told of ('' for none).
    """
    spec = _spec(value)
    kind = spec.get("kind", "none")
    if kind == "none":
        return {"kind": "none", "source": "", "fstype": "", "options": "", "path": "", "packages": [], "unit": "",
                "ray_path": ""}
    fstype = str(spec.get("fstype")).strip()
    path = posixpath.normpath(str(spec.get("path") or DEFAULT_PATH))
    packages = spec.get("packages")
    if packages is None:
        packages = CLIENT_PACKAGES.get(fstype, [])
    return {"kind": kind, "source": str(spec.get("source")).strip(), "fstype": fstype,
            "options": str(spec.get("options") or DEFAULT_OPTIONS).strip(), "path": path, "packages": list(packages),
            "unit": mount_unit_name(path), "ray_path": path}


class FilterModule:
    """raymetal shared storage filters."""

    def filters(self):
        return {
            "shared_storage_problems": shared_storage_problems,
            "shared_storage_settings": shared_storage_settings,
        }
