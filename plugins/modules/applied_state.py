#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""Record what a deploy applied to a node, and tell a later run whether anything differs since."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: applied_state
short_description: Record what a deploy left on a node, and compare the node with that record later
version_added: "0.1.0"
description:
  - >-
    The node-side half of the deploy's fast path (C(playbooks/fast_path.yml)). At the end of a deploy
    that succeeded everywhere, O(state=record) writes a stamp on the node: the digest of the deploy's
    inputs (computed on the controller by the C(raymetal.cluster.deploy_inputs) lookup) and a
    fingerprint of everything O(watch) names, as it is now.
  - >-
    O(state=probe) reads the stamp, takes the same fingerprint again and compares both with this run's
    O(inputs). RV(fresh) is true only when the inputs are the same and nothing watched differs; RV(differs)
    names each difference, so a user sees why a run goes the full way.
  - "Fingerprints: files by content, type, mode, owner and group (directories recursively, symbolic links
    by target); systemd units by active and enablement state; Python virtual environments by the directory
    the link resolves to and the distributions installed; kernel modules by presence; InfiniBand ports by
    state; commands by their output."
  - >-
    O(state=probe) also checks that the fabric address the last run published for this host
    (C(ansible_facts.fabric.address) in O(published)) is still one of the node's addresses: a socket is
    bound to it, and a node that no longer holds it differs from its record (its firewall peers and the
    cluster know it by that address). Where the node cannot tell (another error than the address being
    unavailable), nothing is said.
  - >-
    Only reads the node in O(state=probe). O(state=record) writes the stamp only (mode 0600), and is
    skipped in check mode.
options:
  state:
    description: C(probe) compares; C(record) writes the stamp.
    type: str
    choices: [probe, record]
    default: probe
  path:
    description: The stamp file.
    type: path
    default: /var/lib/raymetal/applied.json
  inputs:
    description: Digest of the deploy's inputs (settings, inventory, raymetal's code), from the controller.
    type: str
    required: true
  watch:
    description: What to fingerprint. Every key is optional.
    type: dict
    default: {}
    suboptions:
      paths:
        description: Files and directories (recursively). A missing path is fingerprinted as absent.
        type: list
        elements: path
        default: []
      units:
        description: systemd unit names (with their suffix).
        type: list
        elements: str
        default: []
      venvs:
        description: Python virtual environments (the path may be a link to the real one).
        type: list
        elements: path
        default: []
      kernel_modules:
        description: Kernel module names, present or not (C(/sys/module/NAME)).
        type: list
        elements: str
        default: []
      ib_ports:
        description: Fingerprint the state of every InfiniBand port (C(/sys/class/infiniband)).
        type: bool
        default: false
      commands:
        description: Commands (argument lists, run without a shell) whose output is fingerprinted.
        type: list
        elements: list
        default: []
  published:
    description:
      - O(state=record) only. What the run published for this host that a later run reads without redoing
        the work; RV(applied) returns it, and a probe that finds the node fresh returns its
        C(ansible_facts) key as the host's facts (the fabric address the cluster summary matches nodes by).
    type: dict
    default: {}
author:
  - raymetal contributors (@raymetal)
"""

EXAMPLES = r"""
- name: Compare the node with what the last deploy applied
  raymetal.cluster.applied_state:
    inputs: "{{ files_digest }}-{{ vars_digest }}"
    watch:
      paths: [/etc/ray, /etc/systemd/system]
      units: [ray-worker.service]
      venvs: [/opt/ray/venv]
  register: probe

- name: Record what this deploy applied
  raymetal.cluster.applied_state:
    state: record
    inputs: "{{ digest }}"
    watch: "{{ same_watch_as_the_probe }}"
    published:
      ansible_facts:
        fabric: {address: "{{ ray_node_ip }}"}
"""

RETURN = r"""
fresh:
  description: The inputs are those of the recorded run and nothing watched differs (probe).
  returned: always
  type: bool
differs:
  description: One line per difference (at most 20, then a count).
  returned: always
  type: list
  elements: str
  sample: ["/etc/ray/ray.env: content", "ray-worker.service: inactive/enabled, recorded active/enabled"]
code_same:
  description: The half of O(inputs) before its first C(-) (raymetal's code and the inventory's files, from the
    C(deploy_inputs) lookup) is the recorded one (probe); false without a record.
  returned: always
  type: bool
state_same:
  description: Nothing that O(watch) lists differs from the record and the recorded fabric address is still on
    the node (probe), so what differs, if anything, is the inputs alone; false without a record.
  returned: always
  type: bool
applied:
  description: The facts recorded with O(published) by the last run (probe), or those written (record).
  returned: always
  type: dict
ansible_facts:
  description: The recorded O(published) C(ansible_facts), when the probe finds the node fresh.
  returned: probe, when fresh
  type: dict
recorded_at:
  description: When the stamp was written (UTC, ISO 8601), empty when there is none.
  returned: always
  type: str
"""

import errno
import glob
import hashlib
import json
import os
import socket
import stat
import time

from ansible.module_utils.basic import AnsibleModule

STAMP_VERSION = 1
# Larger files are fingerprinted by size and modification time, not content.
HASH_LIMIT = 16 * 1024 * 1024
MAX_LINES = 20


def _sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _entry(path, st):
    mode = stat.S_IMODE(st.st_mode)
    owner = "%04o %d:%d" % (mode, st.st_uid, st.st_gid)
    if stat.S_ISLNK(st.st_mode):
        return "link " + os.readlink(path)
    if stat.S_ISDIR(st.st_mode):
        return "dir " + owner
    if stat.S_ISREG(st.st_mode):
        if st.st_size > HASH_LIMIT:
            return "file %s size=%d mtime=%d" % (owner, st.st_size, st.st_mtime_ns)
        return "file %s %s" % (owner, _sha256_file(path))
    return "other " + owner


def fingerprint_path(root):
    """{path: fingerprint} for root and, for a directory, everything under it."""
    result = {}
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return {root: "absent"}
    result[root] = _entry(root, st)
    if stat.S_ISDIR(st.st_mode):
        for current, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(dirs + files):
                path = os.path.join(current, name)
                try:
                    result[path] = _entry(path, os.lstat(path))
                except OSError as exc:
                    result[path] = "unreadable %s" % exc.__class__.__name__
    return result


def fingerprint_units(module, units):
    if not units:
        return {}
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return dict(("unit " + unit, "no systemctl") for unit in units)
    cmd = [systemctl, "show", "--property=Id,LoadState,ActiveState,UnitFileState", "--"] + list(units)
    rc, out, err = module.run_command(cmd)
    if rc != 0:
        return dict(("unit " + unit, "systemctl rc=%d" % rc) for unit in units)
    # One block per unit, in the order asked, separated by blank lines.
    blocks = out.strip().split("\n\n")
    result = {}
    for unit, block in zip(units, blocks):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("LoadState") == "not-found":
            result["unit " + unit] = "absent"
        else:
            result["unit " + unit] = "%s/%s" % (props.get("ActiveState", "?"), props.get("UnitFileState") or "-")
    return result


def fingerprint_venv(venv):
    real = os.path.realpath(venv)
    if not os.path.isdir(real):
        return {"venv " + venv: "absent"}
    dists = sorted(os.path.basename(path) for path in glob.glob(os.path.join(real, "lib", "python*", "site-packages", "*.dist-info")))
    return {"venv " + venv: real + " " + hashlib.sha256("\n".join(dists).encode()).hexdigest()}


def fingerprint_ib_ports(sysfs="/sys/class/infiniband"):
    states = []
    for path in sorted(glob.glob(os.path.join(sysfs, "*", "ports", "*", "state"))):
        try:
            with open(path) as handle:
                states.append("%s %s" % (path, handle.read().strip()))
        except OSError:
            states.append("%s unreadable" % path)
    return {"infiniband ports": "\n".join(states) or "none"}


def fingerprint_command(module, argv):
    name = "command " + " ".join(argv)
    if not argv or not module.get_bin_path(argv[0]) and not os.path.isabs(argv[0]):
        return {name: "not found"}
    rc, out, err = module.run_command(list(argv))
    return {name: "rc=%d %s" % (rc, hashlib.sha256(out.encode()).hexdigest())}


def fingerprint(module, watch, sysfs_module="/sys/module"):
    result = {}
    for path in watch.get("paths") or []:
        result.update(fingerprint_path(path))
    result.update(fingerprint_units(module, watch.get("units") or []))
    for venv in watch.get("venvs") or []:
        result.update(fingerprint_venv(venv))
    for name in watch.get("kernel_modules") or []:
        result["kernel module " + name] = "loaded" if os.path.isdir(os.path.join(sysfs_module, name)) else "not loaded"
    if watch.get("ib_ports"):
        result.update(fingerprint_ib_ports())
    for argv in watch.get("commands") or []:
        result.update(fingerprint_command(module, argv))
    return result


def address_gone(address):
    """A line saying that `address` (the fabric address the last run published) is no longer on this node, when a
    socket cannot bind to it for that reason; '' when it can, when there is no address, or when the node cannot
    tell (another error: the check never makes a difference up)."""
    address = str(address or "").split("/", 1)[0].strip()
    if not address:
        return ""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_DGRAM)
    except OSError:
        return ""
    try:
        sock.bind((address, 0))
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            return "fabric address %s: no longer on this node (the last deploy's record has it)" % address
        return ""
    finally:
        sock.close()
    return ""


def compare(recorded, current):
    """Lines naming each key whose fingerprint differs, appeared or went away."""
    lines = []
    for key in sorted(set(recorded) | set(current)):
        old = recorded.get(key)
        new = current.get(key)
        if old == new:
            continue
        if old is None:
            lines.append("%s: new (%s)" % (key, new.split(" ")[0]))
        elif new is None:
            lines.append("%s: gone" % key)
        elif key.startswith("unit ") or key.startswith("kernel module "):
            lines.append("%s: %s, recorded %s" % (key, new, old))
        elif key.startswith("venv "):
            if old.split(" ")[0] != new.split(" ")[0]:
                lines.append("%s: now %s, recorded %s" % (key, new.split(" ")[0], old.split(" ")[0]))
            else:
                lines.append("%s: installed distributions" % key)
        elif not key.startswith("/"):
            lines.append("%s: output" % key)
        elif old.split(" ")[:2] != new.split(" ")[:2]:
            lines.append("%s: type, mode or owner (%s, recorded %s)" % (key, " ".join(new.split(" ")[:2]),
                                                                        " ".join(old.split(" ")[:2])))
        else:
            lines.append("%s: content" % key)
    return lines


def input_halves(inputs):
    """The two halves of the inputs ('<files>-<vars>', from the deploy_inputs lookup): [files, vars]."""
    return (inputs.split("-", 1) + [""])[:2]


def inputs_differ(recorded, current):
    """Which half of the inputs changed."""
    if recorded == current:
        return []
    old = input_halves(recorded)
    new = input_halves(current)
    lines = []
    if old[0] != new[0]:
        lines.append("raymetal's code or the inventory's files changed since the last deploy")
    if old[1] != new[1]:
        lines.append("this host's variables (group and extra variables included) or the inventory's groups changed "
                     "since the last deploy")
    return lines or ["the deploy's inputs changed since the last deploy"]


def read_stamp(path):
    try:
        with open(path) as handle:
            stamp = json.load(handle)
    except FileNotFoundError:
        return None, "no record of an earlier deploy on this node"
    except (OSError, ValueError) as exc:
        return None, "the record of the last deploy (%s) is unreadable: %s" % (path, exc)
    if not isinstance(stamp, dict) or stamp.get("version") != STAMP_VERSION:
        return None, "the record of the last deploy (%s) is from another raymetal version" % path
    return stamp, ""


def write_stamp(path, stamp):
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(stamp, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["probe", "record"], default="probe"),
            path=dict(type="path", default="/var/lib/raymetal/applied.json"),
            inputs=dict(type="str", required=True),
            watch=dict(
                type="dict",
                default={},
                options=dict(
                    paths=dict(type="list", elements="path", default=[]),
                    units=dict(type="list", elements="str", default=[]),
                    venvs=dict(type="list", elements="path", default=[]),
                    kernel_modules=dict(type="list", elements="str", default=[]),
                    ib_ports=dict(type="bool", default=False),
                    commands=dict(type="list", elements="list", default=[]),
                ),
            ),
            published=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    params = module.params
    watch = params["watch"] or {}
    current = fingerprint(module, watch)

    if params["state"] == "record":
        stamp = {
            "version": STAMP_VERSION,
            "inputs": params["inputs"],
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "state": current,
            "published": params["published"],
        }
        old, dummy = read_stamp(params["path"])
        same = old is not None and all(old.get(k) == stamp[k] for k in ("inputs", "state", "published"))
        if not same and not module.check_mode:
            try:
                write_stamp(params["path"], stamp)
            except OSError as exc:
                module.fail_json(msg="Could not write %s: %s. Fix: check that the directory is writable by root." % (params["path"], exc))
        recorded_at = old["recorded_at"] if same else stamp["recorded_at"]
        module.exit_json(changed=not same, fresh=True, differs=[], code_same=True, state_same=True,
                         applied=params["published"], recorded_at=recorded_at)

    stamp, why = read_stamp(params["path"])
    if stamp is None:
        module.exit_json(changed=False, fresh=False, differs=[why], code_same=False, state_same=False, applied={},
                         recorded_at="")
    differs = inputs_differ(stamp.get("inputs") or "", params["inputs"])
    code_same = input_halves(stamp.get("inputs") or "")[0] == input_halves(params["inputs"])[0]
    applied = stamp.get("published") or {}
    facts = applied.get("ansible_facts")
    fabric = facts.get("fabric") if isinstance(facts, dict) else None
    # Before the files' lines, so that a long list never cuts it off.
    gone = address_gone(fabric.get("address") if isinstance(fabric, dict) else "")
    if gone:
        differs.append(gone)
    watched = compare(stamp.get("state") or {}, current)
    differs.extend(watched)
    if len(differs) > MAX_LINES:
        differs = differs[:MAX_LINES] + ["and %d more" % (len(differs) - MAX_LINES)]
    result = dict(changed=False, fresh=not differs, differs=differs, code_same=code_same,
                  state_same=not gone and not watched, applied=applied,
                  recorded_at=stamp.get("recorded_at", ""))
    if not differs and isinstance(facts, dict):
        result["ansible_facts"] = facts
    module.exit_json(**result)


def main():
    run_module()


if __name__ == "__main__":
    main()
