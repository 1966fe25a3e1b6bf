"""Controller-side helpers shared by raymetal's filters (never shipped to nodes).

Imported as ansible_collections.raymetal.cluster.plugins.plugin_utils.ssh_tunnel, which
resolves both in this repository (collections/ansible_collections/raymetal/cluster is a
link to the repository root) and in the installed collection.
"""

from __future__ import annotations

import os


def _shown_key(key, cwd):
    """The key file normalised, and relative to ``cwd`` when it lies under it."""
    key = os.path.normpath(os.path.expanduser(str(key)))
    cwd = str(cwd or "")
    if cwd and os.path.isabs(key) and key.startswith(os.path.normpath(cwd) + os.sep):
        key = os.path.relpath(key, cwd)
    return key


def tunnel_command(address, port, ssh=None):
    """The ``ssh -N -L`` command that brings address:port to 127.0.0.1:port on a workstation.

    ssh: how Ansible reaches the host: ``host``, ``user``, ``port``, ``key`` (private key
    file), ``common_args`` (ansible_ssh_common_args) and ``cwd`` (key paths under it are
    shown relative to it, as the playbook's own directory is where users run it from).
    """
    ssh = ssh or {}
    cmd = ["ssh", "-N", "-o", "ExitOnForwardFailure=yes", "-L", "%d:%s:%d" % (int(port), address, int(port))]
    if ssh.get("port") not in (None, "", 22, "22"):
        cmd += ["-p", str(ssh["port"])]
    if ssh.get("key"):
        cmd += ["-i", _shown_key(ssh["key"], ssh.get("cwd"))]
    if ssh.get("common_args"):
        cmd += [str(ssh["common_args"]).strip()]
    target = str(ssh.get("host") or "?")
    if ssh.get("user"):
        target = "%s@%s" % (ssh["user"], target)
    cmd.append(target)
    return " ".join(cmd)
