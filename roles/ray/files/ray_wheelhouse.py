"""Build the offline wheelhouse that raymetal ships to air-gapped nodes.

    python3 ray_wheelhouse.py --dest DIR [--python-version 3.11] \\
        [--node-machine x86_64 --node-glibc 2.36] [--platform TAG ...] \\
        [--index-url URL] 'ray[default]==2.60.0' numpy==2.2.6 ...

``pip download`` of the requirements and all their dependencies into DIR, for
the nodes' Python: wheels only, always (``--only-binary=:all:``: the nodes
install with ``--require-hashes`` and never build a source package, whose
build code would run as root there). When the nodes' Python release, machine
and C library match this interpreter's, a plain ``pip download`` of wheels;
otherwise for ``--python-version`` and the manylinux platforms the nodes'
glibc accepts (or the ``--platform`` tags given). A wheelhouse that holds a
source distribution (left by hand, or by an older raymetal) is refused, the
file named, before pip runs.

Cached and idempotent: pip first tries to satisfy every requirement from DIR
alone (``--no-index``); when it can, nothing is downloaded and DIR is left as it
is. When pip must go to the index, what DIR already holds is kept: each
distribution present in exactly one version is given to pip as a constraint, so
adding a package fetches that package and what it alone needs, not newer
releases of everything Ray depends on (without the constraints only when they
conflict with the new requirements). Prints one JSON object: ``changed``, ``dest``, ``added`` (new files),
``mode`` (``native`` or ``cross``) and ``pip_args``. Exits 1 with a readable
message (pip's own error included) when a requirement cannot be found. Used by
``playbooks/wheelhouse.yml`` (the ray role's ``wheelhouse`` entry point, which
runs this file from the role, so it ships with the collection) and by
``lab/lab.sh wheelhouse``. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

# The oldest manylinux the wheels we need use (manylinux2014 == manylinux_2_17).
OLDEST_GLIBC_MINOR = 17


class WheelhouseError(Exception):
    """A failure with one message meant for the user."""


def local_target() -> Dict[str, str]:
    """Python release, machine and glibc of this interpreter."""
    libc, version = platform.libc_ver()
    return {"python": "%d.%d" % sys.version_info[:2], "machine": platform.machine(),
            "glibc": version if libc == "glibc" else ""}


def _glibc_minor(version: str) -> Optional[int]:
    match = re.fullmatch(r"2\.(\d+)", str(version or "").strip())
    return int(match.group(1)) if match else None


def manylinux_platforms(machine: str, glibc: str) -> List[str]:
    """The manylinux tags a host with this machine and glibc installs, newest first."""
    minor = _glibc_minor(glibc)
    if not machine or minor is None:
        raise WheelhouseError(
            "cannot tell which wheels the nodes accept: machine %r, glibc %r. Give --platform "
            "(ray_wheelhouse_platforms), e.g. manylinux_2_28_x86_64" % (machine, glibc))
    tags = ["manylinux_2_%d_%s" % (m, machine) for m in range(minor, OLDEST_GLIBC_MINOR - 1, -1)]
    tags += ["manylinux2014_%s" % machine]
    if machine in ("x86_64", "i686"):
        tags += ["manylinux2010_%s" % machine, "manylinux1_%s" % machine]
    return tags


def target_args(python_version: str = "", node_machine: str = "", node_glibc: str = "",
                platforms: Sequence[str] = (), here: Optional[Dict[str, str]] = None):
    """pip's target options for the nodes: ([] , 'native') or (wheel-only options, 'cross')."""
    here = here or local_target()
    python_version = str(python_version or here["python"])
    if not re.fullmatch(r"3\.\d+", python_version):
        raise WheelhouseError("python version %r is not of the form 3.N (ray_wheelhouse_python_version)"
                              % python_version)
    node_machine = node_machine or here["machine"]
    node_glibc = node_glibc or here["glibc"]
    here_minor, node_minor = _glibc_minor(here["glibc"]), _glibc_minor(node_glibc)
    native = (not platforms and python_version == here["python"] and node_machine == here["machine"]
              and here_minor is not None and node_minor is not None and node_minor >= here_minor)
    if native:
        return [], "native"
    tags = list(platforms) or manylinux_platforms(node_machine, node_glibc)
    abi = "cp" + python_version.replace(".", "")
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", "--abi", abi]
    for tag in tags:
        args += ["--platform", tag]
    return args, "cross"


def _files(dest: str) -> List[str]:
    return sorted(f for f in os.listdir(dest) if not f.startswith("."))


def held_versions(files: Sequence[str]) -> Dict[str, str]:
    """{normalized name: version} of the distributions present in exactly one version."""
    seen: Dict[str, set] = {}
    for name in files:
        if name.endswith(".whl"):
            parts = name[:-4].split("-")
            if len(parts) < 5:
                continue
            dist, version = parts[0], parts[1]
        else:
            match = re.match(r"^(.+)-([0-9][^-]*)\.(tar\.gz|zip)$", name)
            if not match:
                continue
            dist, version = match.group(1), match.group(2)
        seen.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), set()).add(version)
    return {dist: versions.pop() for dist, versions in seen.items() if len(versions) == 1}


SDIST_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar", ".zip", ".egg")


def source_distributions(files: Sequence[str]) -> List[str]:
    """The source distributions among files (what the nodes refuse to install)."""
    return sorted(name for name in files if name.lower().endswith(SDIST_SUFFIXES))


def _pip_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    wanted = [line for line in lines if line.startswith("ERROR")]
    return (wanted or lines or ["(pip printed nothing)"])[-1]


def build(dest: str, requirements: Sequence[str], target: Sequence[str], index_url: str = "",
          run=subprocess.run) -> Dict[str, object]:
    """Make dest satisfy requirements (for target); return the JSON report."""
    if not requirements:
        raise WheelhouseError("no requirements given")
    os.makedirs(dest, exist_ok=True)
    sdists = source_distributions(_files(dest))
    if sdists:
        raise WheelhouseError(
            "%s holds source distributions, which the nodes never install (pip would build them, running their "
            "code as root there): %s. Remove them and run again: only wheels are downloaded"
            % (dest, ", ".join(sdists)))
    pip = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "-d", dest]
    if "--only-binary=:all:" not in target:
        pip.append("--only-binary=:all:")
    env = dict(os.environ, PIP_NO_INPUT="1")
    offline = run(pip + ["--no-index", "--find-links", dest] + list(target) + list(requirements),
                  capture_output=True, text=True, env=env, check=False)
    report = {"dest": dest, "requirements": list(requirements), "pip_args": list(target), "added": [],
              "changed": False}
    if offline.returncode == 0:
        return report
    before = set(_files(dest))
    index = ["--index-url", index_url] if index_url else []
    online = None
    held = held_versions(sorted(before))
    if held:
        with tempfile.NamedTemporaryFile("w", prefix="wheelhouse-held-", suffix=".txt", delete=False) as handle:
            handle.write("".join("%s==%s\n" % item for item in sorted(held.items())))
        try:
            online = run(pip + index + ["--constraint", handle.name] + list(target) + list(requirements),
                         capture_output=True, text=True, env=env, check=False)
        finally:
            os.unlink(handle.name)
    if online is None or online.returncode != 0:
        online = run(pip + index + list(target) + list(requirements), capture_output=True, text=True, env=env, check=False)
    if online.returncode != 0:
        raise WheelhouseError(
            "pip download into %s failed for %s: %s. Check each name and pinned version on the index; only "
            "wheels are fetched (the nodes install nothing else), so a package without a wheel for the nodes' "
            "Python and platform must be built into a wheel on a machine like them and put in the wheelhouse"
            % (dest, " ".join(requirements), _pip_error(online.stderr)))
    report["added"] = sorted(set(_files(dest)) - before)
    report["changed"] = bool(report["added"])
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="ray_wheelhouse.py", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--dest", required=True, help="wheelhouse directory (created when absent)")
    parser.add_argument("--python-version", default="", help="the nodes' Python release, 3.N (default: this one's)")
    parser.add_argument("--node-machine", default="", help="the nodes' machine, e.g. x86_64 (default: this one's)")
    parser.add_argument("--node-glibc", default="", help="the nodes' glibc version, e.g. 2.36 (default: this one's)")
    parser.add_argument("--platform", action="append", default=[], help="wheel platform tag (repeatable)")
    parser.add_argument("--index-url", default="", help="package index (default: pip's configuration)")
    parser.add_argument("requirements", nargs="+", help="pip requirement specifiers")
    args = parser.parse_args(argv)
    try:
        target, mode = target_args(args.python_version, args.node_machine, args.node_glibc, args.platform)
        report = build(os.path.abspath(args.dest), args.requirements, target, args.index_url)
    except WheelhouseError as err:
        print("wheelhouse: %s" % err, file=sys.stderr)
        return 1
    report["mode"] = mode
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
