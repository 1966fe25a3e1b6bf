#!/usr/bin/env python3
"""Write inventory/sample/group_vars/all/*.yml from the roles' argument specs: every public variable,
commented out at its default, under its description, grouped by topic. A site copies inventory/sample and
uncomments what it changes. `python3 tools/sample_group_vars.py --check` fails when the files are stale
(run by a unit test), so the sample never drifts from the roles.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "inventory" / "sample" / "group_vars" / "all"

# Topic files, in order; a variable goes to the first topic whose test matches.
OFFLINE = {"ray_install_source", "ray_pip_index_url", "ray_wheelhouse_src", "ray_wheelhouse_dir",
           "ray_wheelhouse_python_version", "ray_wheelhouse_platforms", "nccl_pip_index_url",
           "nccl_wheelhouse_src", "nccl_wheelhouse_dir", "nccl_wheelhouse_transfer"}
TOPICS = [
    ("offline.yml", "Offline nodes: where Python and OS packages come from (wheelhouses, indexes, mirrors)",
     lambda role, name: name in OFFLINE or role == "package_mirror"),
    ("fabric.yml", "The fabric (InfiniBand / RoCE) and RDMA", lambda role, name: role == "fabric"),
    ("nvidia_driver.yml", "NVIDIA driver", lambda role, name: role == "nvidia_driver"),
    ("ray.yml", "Ray: version, addresses, ports, resources, token, systemd", lambda role, name: role == "ray"),
    ("gcs_redis.yml", "Redis for the head's GCS (ray_gcs_fault_tolerance: redis)", lambda role, name: role == "gcs_redis"),
    ("nccl.yml", "NCCL (the only owner of NCCL's settings: /etc/nccl.conf)", lambda role, name: role == "nccl"),
    ("firewall.yml", "Firewall", lambda role, name: role == "firewall"),
    ("acceptance.yml", "Acceptance (playbooks/acceptance.yml)", lambda role, name: role == "acceptance"),
    ("monitoring.yml", "Monitoring: Prometheus, node_exporter, alert rules", lambda role, name: role == "monitoring"),
    ("shared_storage.yml", "Shared storage for Ray Train's checkpoints (raymetal_shared_storage)",
     lambda role, name: role == "shared_storage"),
    ("health.yml", "The node health loop (a sick worker drained and stopped; the deploy passes the wired inputs)",
     lambda role, name: role == "health"),
]

# What a topic says before its variables: the inventory-level names that several roles read.
PREAMBLES = {
    "shared_storage.yml": """\
# The storage every node shares, where Ray Train and Tune keep checkpoints: one
# dict, read by the shared_storage role (the mount), the ray role (Ray may write
# there, RAYMETAL_STORAGE_PATH in every Ray process, its unit after the mount)
# and acceptance (every node writes and reads it back). Absent or kind none:
# nothing (a mount raymetal made before is unmounted; the data stays).
# Kind mount, a site's shared filesystem at the same path on every node:
#   source    what to mount (nfs01:/export/ray, mgs@o2ib:/lustre, ...)
#   fstype    nfs, lustre, gpfs, ceph, ... (a systemd mount unit's Type=)
#   options   mount options, comma-separated (default: defaults)
#   path      where (default: /mnt/ray-shared)
#   packages  client packages from the site's mirror (default: nfs-common for
#             nfs, ceph-common for ceph; none for the others: name the vendor's)
# The share must be writable by the Ray user (ray_user), with the same uid on
# every node. See docs/storage.md.
# raymetal_shared_storage:
#   kind: mount
#   source: nfs01:/export/ray
#   fstype: nfs
#   options: vers=4.2,hard,noatime

""",
}


def options():
    for spec_file in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        role = spec_file.parts[-3]
        specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
        defaults = yaml.safe_load((spec_file.parents[1] / "defaults" / "main.yml").read_text()) or {}
        for name, spec in specs["main"]["options"].items():
            if "default" not in spec and isinstance(defaults.get(name), str) and "{{" in defaults[name]:
                # A computed default the spec cannot state in its type (a templated bool): the role's own.
                spec = dict(spec, default=defaults[name])
            yield role, name, spec


def render():
    files = {name: [] for name, _, _ in TOPICS}
    for role, name, spec in options():
        topic = next(t for t, _, test in TOPICS if test(role, name))
        description = spec.get("description") or ""
        if isinstance(description, list):
            description = " ".join(description)
        lines = textwrap.wrap(" ".join(description.split()), 100)
        dumped = yaml.safe_dump(spec.get("default"), default_flow_style=True, width=200)
        value = "%s: %s" % (name, "\n".join(v for v in dumped.splitlines() if v != "...").strip())
        files[topic].append("\n".join(["# " + line for line in lines] + ["# " + v for v in value.splitlines()]))
    rendered = {}
    for topic, title, _ in TOPICS:
        head = ("---\n# %s.\n# Generated from the roles' meta/argument_specs.yml by tools/sample_group_vars.py:\n"
                "# every variable at its default, commented out. Uncomment what your site changes.\n" % title)
        rendered[topic] = head + "\n" + PREAMBLES.get(topic, "") + "\n\n".join(files[topic]) + "\n"
    return rendered


def main(argv):
    rendered = render()
    if "--check" in argv:
        stale = [t for t, text in rendered.items() if not (OUT / t).is_file() or (OUT / t).read_text() != text]
        if stale:
            print("stale: %s; run python3 tools/sample_group_vars.py" % ", ".join(stale))
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for topic, text in rendered.items():
        (OUT / topic).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
