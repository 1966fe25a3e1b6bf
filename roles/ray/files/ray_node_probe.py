"""Report, as one JSON object, what the ray role must know about a node before it changes anything.

Run by the node's system Python (standard library only) in one round trip:

    python3 ray_node_probe.py VENV TEMP_DIR STAMP_FILE WHEEL_DIR RESTART_MARKER [LINK [UNITS [ACCOUNT]]]

- shm_bytes: size of /dev/shm (where Ray's object store lives)
- temp_free_mb: free space on the filesystem that holds (or will hold) TEMP_DIR
- ray, python: the Ray and Python versions inside VENV ("none" when VENV or Ray is missing)
- interpreter: the Python that runs this probe, which is the one the venv is made from (ray_python):
  version (X.Y.Z), machine and glibc, so the wheels for this node can be chosen before any venv exists
- stamp: the install record that the role wrote into VENV after its last pip run (null if none)
- wheels: the file names in WHEEL_DIR on the node, sorted (only when WHEEL_DIR is not empty)
- restart_pending: the reason recorded in RESTART_MARKER by a run that changed Ray's files but did not get
  to restart Ray (it failed later), or null: the next run owes that restart
- link: what LINK is (only when LINK is given): the target it points to, "directory" for a
  real directory, "other" for anything else, null when it does not exist
- units: for each systemd unit named in UNITS (comma-separated), "ENABLED/ACTIVE" as `systemctl is-enabled`
  and `systemctl is-active` print them ("enabled/active", "not-found/inactive", ...); only when UNITS is given
- account: for ACCOUNT ("USER:GROUP"), the user's passwd entry (name, uid, group: the name of its primary group,
  home, shell, comment) and the group's (name, gid), each null when missing; only when ACCOUNT is given
- isolation: what Ray's cgroup v2 resource isolation needs to know: cgroup2 (whether /sys/fs/cgroup is the
  unified cgroup v2 hierarchy), controllers (those it offers), kernel, cpus (usable by this process) and
  memory_bytes (MemTotal)
"""

import grp
import json
import os
import platform
import pwd
import subprocess
import sys

# Run by the venv's interpreter: the versions that the cluster-wide preflight compares.
VERSIONS = (
    "import json, sys, importlib.metadata as m\n"
    "try:\n"
    "    ray = m.version('ray')\n"
    "except m.PackageNotFoundError:\n"
    "    ray = 'none'\n"
    "print(json.dumps({'ray': ray, 'python': sys.version.split()[0]}))\n"
)


def existing_parent(path):
    """The nearest existing directory at or above path."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def venv_versions(venv):
    """Ray and Python versions inside the venv, or 'none' for what is missing."""
    python = os.path.join(venv, "bin", "python")
    if not os.access(python, os.X_OK):
        return {"ray": "none", "python": "none"}
    try:
        proc = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True, timeout=120, check=False)
        found = json.loads(proc.stdout) if proc.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        found = {}
    return {"ray": found.get("ray", "none"), "python": found.get("python", "none")}


def read_stamp(path):
    """The install record, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def list_wheels(directory):
    """Sorted plain file names in directory (no hidden files), [] when it does not exist."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(n for n in names if not n.startswith(".") and os.path.isfile(os.path.join(directory, n)))


def read_marker(path):
    """The reason recorded in the restart marker, or None when there is no marker."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or "an earlier run changed Ray's configuration"
    except FileNotFoundError:
        return None
    except OSError as err:
        return "restart marker %s unreadable (%s)" % (path, err.strerror)


def describe_link(path):
    """The target of the link at path, "directory", "other", or None when nothing is there."""
    if os.path.islink(path):
        return os.readlink(path)
    if os.path.isdir(path):
        return "directory"
    return "other" if os.path.lexists(path) else None


def account_facts(account):
    """The passwd entry of USER and the group entry of GROUP ("USER:GROUP"), each None when missing."""
    user_name, dummy, group_name = account.partition(":")
    try:
        pw = pwd.getpwnam(user_name)
        try:
            primary = grp.getgrgid(pw.pw_gid).gr_name
        except KeyError:
            primary = str(pw.pw_gid)
        user = {"name": pw.pw_name, "uid": pw.pw_uid, "group": primary, "home": pw.pw_dir, "shell": pw.pw_shell,
                "comment": pw.pw_gecos}
    except KeyError:
        user = None
    try:
        gr = grp.getgrnam(group_name)
        group = {"name": gr.gr_name, "gid": gr.gr_gid}
    except KeyError:
        group = None
    return {"user": user, "group": group}


def unit_states(units):
    """{unit: "ENABLED/ACTIVE"} from systemctl (two calls for every unit at once); "unknown" where it cannot tell."""
    names = [u for u in units if u]
    if not names:
        return {}
    answers = {}
    for verb in ("is-enabled", "is-active"):
        try:
            proc = subprocess.run(["systemctl", verb, "--"] + names, capture_output=True, text=True, timeout=60,
                                  check=False, env=dict(os.environ, LC_ALL="C"))
            lines = proc.stdout.splitlines()
        except (OSError, subprocess.TimeoutExpired):
            lines = []
        if len(lines) != len(names):
            lines = ["unknown"] * len(names)
        answers[verb] = [line.strip() or "unknown" for line in lines]
    return dict((name, "%s/%s" % (enabled, active))
                for name, enabled, active in zip(names, answers["is-enabled"], answers["is-active"]))


def isolation_facts(cgroup_root="/sys/fs/cgroup", meminfo="/proc/meminfo"):
    """What decides whether Ray can isolate its own processes in cgroups on this node."""
    controllers_file = os.path.join(cgroup_root, "cgroup.controllers")
    try:
        with open(controllers_file, encoding="utf-8") as handle:
            controllers = handle.read().split()
        cgroup2 = True
    except OSError:  # cgroup v1 or hybrid: the root is a tmpfs of per-controller hierarchies
        controllers, cgroup2 = [], False
    memory = 0
    try:
        with open(meminfo, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    memory = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    return {"cgroup2": cgroup2, "controllers": controllers, "kernel": os.uname().release, "cpus": cpus,
            "memory_bytes": memory}


def interpreter_facts():
    """Version, machine and C library of the Python running this probe (ray_python)."""
    libc, libc_version = platform.libc_ver()
    return {"version": platform.python_version(), "machine": platform.machine(),
            "glibc": libc_version if libc == "glibc" else ""}


def probe(venv, temp_dir, stamp_file, wheel_dir=None, restart_marker=None, link=None, units=None, account=None,
          shm="/dev/shm"):
    """Everything the role reads from the node, as a dict."""
    shm_stat = os.statvfs(shm)
    temp_stat = os.statvfs(existing_parent(temp_dir))
    result = {
        "shm_bytes": shm_stat.f_blocks * shm_stat.f_frsize,
        "temp_free_mb": temp_stat.f_bavail * temp_stat.f_frsize // (1024 * 1024),
        "stamp": read_stamp(stamp_file),
        "restart_pending": read_marker(restart_marker),
        "isolation": isolation_facts(),
        "interpreter": interpreter_facts(),
    }
    result.update(venv_versions(venv))
    if wheel_dir:
        result["wheels"] = list_wheels(wheel_dir)
    if link:
        result["link"] = describe_link(link)
    if units:
        result["units"] = unit_states(units.split(","))
    if account:
        result["account"] = account_facts(account)
    return result


def main(argv):
    if len(argv) not in (4, 5, 6, 7, 8, 9):
        sys.stderr.write(__doc__)
        return 2
    print(json.dumps(probe(*argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
