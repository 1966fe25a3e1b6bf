"""raymetal filters for the shared storage every node mounts (raymetal_shared_storage).

``raymetal_shared_storage`` is one dict in the inventory; these filters are the one place that reads it:
``shared_storage_problems`` says what is wrong with it (for the preflight's message), ``shared_storage_settings``
turns a valid one into the settings the roles use, with the defaults filled in.

Kinds:
  none   (or the variable absent) nothing, and what raymetal mounted before is unmounted and removed
  mount  a site's shared filesystem (NFS, Lustre, GPFS, CephFS, ...) mounted at the same path on every node by a
         systemd mount unit: source, fstype, options, path, packages
  s3     an S3-compatible object store (SeaweedFS) that raymetal runs on one host of the cluster, on its fabric
         address: host (default the head), bucket, port, data_dir, size_gb
"""

from __future__ import annotations

import posixpath
import re

KINDS = ("none", "mount", "s3")
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
S3_KEYS = ("kind", "host", "bucket", "port", "data_dir", "size_gb")
S3_DEFAULTS = {"bucket": "ray", "port": 8333, "data_dir": "/var/lib/raymetal-s3", "size_gb": 100}
# SeaweedFS keeps objects in volumes of this size; size_gb of them at most (its -volume.max): the store's limit.
S3_VOLUME_SIZE_MB = 1024
# The store's ports, from its S3 port up: S3 (the fabric), S3's gRPC (the fabric, closed to everyone), then the
# master's, the volume server's and the filer's HTTP and gRPC ports (loopback), then its Prometheus metrics (the
# fabric, open to the scrapers: the monitoring host).
S3_PORTS = 9
# Where SeaweedFS's metrics are, from the S3 port.
S3_METRICS_OFFSET = 8
# Bucket names as S3 allows them (lower case, digits, '.', '-'; 3 to 63 characters; no IP-address form).
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
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


def _path_problems(key, path, example, why=""):
    """A path of raymetal_shared_storage (``key``): absolute, of the characters units accept, not a system
    directory (``why`` says what raymetal would do to one)."""
    normal = posixpath.normpath(path)
    if not _PATH_RE.match(path) or ".." in path.split("/"):
        return ["%s.%s=%r is not an absolute path of letters, digits, '_', '.', '-' and '/'. Fix: choose such a "
                "path, e.g. %s" % (_VAR, key, path, example)]
    if normal in _SYSTEM_DIRS or normal.split("/")[1] in ("proc", "sys", "dev", "run", "boot", "etc", "usr"):
        return ["%s.%s=%s is a system directory%s. Fix: choose a directory of its own, e.g. %s"
                % (_VAR, key, path, why, example)]
    return []


def _s3_problems(spec, hosts):
    problems = []
    host = spec.get("host")
    if host is not None and (not isinstance(host, str) or (hosts is not None and host not in hosts)):
        problems.append("%s.host=%r is not a host of ray_cluster. Fix: name one of %s, or leave host out for the head"
                        % (_VAR, host, ", ".join(sorted(hosts or [])) or "the inventory's hosts"))
    bucket = spec.get("bucket", S3_DEFAULTS["bucket"])
    if not isinstance(bucket, str) or not _BUCKET_RE.match(bucket) or ".." in bucket \
            or re.match(r"^\d+\.\d+\.\d+\.\d+$", bucket):
        problems.append("%s.bucket=%r is not an S3 bucket name (3 to 63 characters: lower-case letters, digits, '.' "
                        "and '-'). Fix: e.g. bucket: ray" % (_VAR, bucket))
    port = spec.get("port", S3_DEFAULTS["port"])
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535 - S3_PORTS + 1:
        problems.append("%s.port=%r is not a port from 1024 to %d (the store uses %d ports from it: its S3 API and, "
                        "on loopback or closed to everyone, its own services). Fix: e.g. port: 8333, outside Ray's "
                        "worker ports (ray_min_worker_port to ray_max_worker_port)"
                        % (_VAR, port, 65535 - S3_PORTS + 1, S3_PORTS))
    size = spec.get("size_gb", S3_DEFAULTS["size_gb"])
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        problems.append("%s.size_gb=%r is not a whole number of GiB of 1 or more. Fix: e.g. size_gb: 500"
                        % (_VAR, size))
    data_dir = spec.get("data_dir", S3_DEFAULTS["data_dir"])
    problems += _path_problems("data_dir", str(data_dir), S3_DEFAULTS["data_dir"], ": the store writes its objects there")
    return problems


def shared_storage_problems(value, hosts=None):
    """Human-readable problems with ``raymetal_shared_storage`` (empty when it is valid); ``hosts``, the hosts of
    ray_cluster, checks kind s3's ``host``."""
    spec = _spec(value)
    if not isinstance(spec, dict):
        return ["%s must be a dict such as {kind: mount, source: 'nfs01:/export/ray', fstype: nfs}, not %r. "
                "Fix: set it as a dict, or leave it out for no shared storage" % (_VAR, spec)]
    problems = []
    kind = spec.get("kind", "none")
    keys = S3_KEYS if kind == "s3" else KEYS
    unknown = sorted(set(spec) - set(keys))
    if unknown:
        problems.append("%s has unknown key(s) %s for kind %s. Fix: use only %s"
                        % (_VAR, ", ".join(unknown), kind, ", ".join(keys)))
    if kind not in KINDS:
        return problems + ["%s.kind=%r is not one of %s. Fix: kind: mount for a site's shared filesystem, s3 for an "
                           "object store raymetal runs, or none" % (_VAR, kind, ", ".join(KINDS))]
    if kind == "none":
        return problems
    if kind == "s3":
        return problems + _s3_problems(spec, hosts)
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
    problems += _path_problems("path", str(spec.get("path") or DEFAULT_PATH), DEFAULT_PATH,
                               ": raymetal mounts over it and unmounts it")
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


def shared_storage_settings(value, head=""):
    """The settings of a valid ``raymetal_shared_storage``, defaults filled in.

    {kind, source, fstype, options, path, packages, unit, ray_path, s3}: ``unit`` is the mount unit's name ('' for
    none), ``ray_path`` the path Ray's processes are told of ('' for none; ``s3://<bucket>`` for kind s3), ``s3``
    kind s3's store ({} for the other kinds): host (``head`` unless set), bucket, port, data_dir, size_gb,
    volumes and volume_size_mb (SeaweedFS's -volume.max and -master.volumeSizeLimitMB), limit_bytes (the store's
    size limit, their product) and metrics_port (its Prometheus metrics).
    """
    spec = _spec(value)
    kind = spec.get("kind", "none")
    nothing = {"kind": kind, "source": "", "fstype": "", "options": "", "path": "", "packages": [], "unit": "",
               "ray_path": "", "s3": {}}
    if kind == "none":
        return nothing
    if kind == "s3":
        s3 = dict(S3_DEFAULTS)
        s3.update({k: v for k, v in spec.items() if k in S3_KEYS and k != "kind" and v is not None})
        s3["host"] = str(spec.get("host") or head)
        s3["data_dir"] = posixpath.normpath(str(s3["data_dir"]))
        s3.update({"volumes": int(s3["size_gb"]), "volume_size_mb": S3_VOLUME_SIZE_MB,
                   "metrics_port": int(s3["port"]) + S3_METRICS_OFFSET})
        s3["limit_bytes"] = s3["volumes"] * S3_VOLUME_SIZE_MB * 1024 * 1024
        return dict(nothing, ray_path="s3://%s" % s3["bucket"], s3=s3)
    fstype = str(spec.get("fstype")).strip()
    path = posixpath.normpath(str(spec.get("path") or DEFAULT_PATH))
    packages = spec.get("packages")
    if packages is None:
        packages = CLIENT_PACKAGES.get(fstype, [])
    return {"kind": kind, "source": str(spec.get("source")).strip(), "fstype": fstype,
            "options": str(spec.get("options") or DEFAULT_OPTIONS).strip(), "path": path, "packages": list(packages),
            "unit": mount_unit_name(path), "ray_path": path, "s3": {}}


class FilterModule:
    """raymetal shared storage filters."""

    def filters(self):
        return {
            "shared_storage_problems": shared_storage_problems,
            "shared_storage_settings": shared_storage_settings,
        }
