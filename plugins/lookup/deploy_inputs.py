# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""The digest of everything a deploy's outcome depends on that lives on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
name: deploy_inputs
short_description: Digest of a deploy's inputs on the controller (code, inventory, settings)
version_added: "0.1.0"
description:
  - The controller-side half of the deploy's fast path (C(playbooks/fast_path.yml)); the
    C(applied_state) module keeps it on every node with what the deploy applied there.
  - "Returns a SHA-256 digest (hex), of one of two halves (O(part)): the ansible-core version; every file of raymetal's
    C(roles), C(playbooks) and C(plugins) directories; every file of each inventory source (a directory
    recursively, following links, without C(acceptance) reports and without the C(host_vars) files of the hosts
    given), the generated credentials included; and, for each host given, the group membership of every host
    given and its own variables before any templating (inventory, C(host_vars), C(group_vars), extra variables,
    a dynamic inventory's too), without Ansible's own run-specific
    variables and without C(raymetal_fast_path), C(raymetal_max_unreachable) and the SSH connection's timeouts,
    retries, control path and pipelining (C(ansible_timeout), C(ansible_ssh_timeout), C(ansible_ssh_retries),
    C(ansible_control_path), C(ansible_control_path_dir), C(ansible_pipelining), C(ansible_ssh_pipelining)),
    which change nothing on a node."
  - "Any change to any of those makes the digest differ, and the fast path then runs the full deploy on the hosts
    it concerns: with O(per_host), a host's variables (its C(host_vars) file, say) concern that host alone; a
    group variable, an extra variable, a group's members, raymetal's code and every other inventory file
    concern every host."
options:
  _terms:
    description:
      - The inventory hosts whose variables count (the cluster's). With O(part=files), their C(host_vars) files
        are left out (their content reaches a deploy only as those hosts' variables, which O(part=vars) digests).
    type: list
    elements: str
  part:
    description:
      - C(files) digests the ansible-core version, raymetal's code and the inventory sources' files; C(vars)
        the given hosts' variables (extra variables included) and groups. A deploy takes both at its start,
        and the C(files) half again at its end (the first deploy generates credentials in the inventory).
    type: str
    choices: [files, vars]
    required: true
  extra_files:
    description:
      - With O(part=files), more files on the controller to digest by content (a missing one counts as
        missing), such as the secrets a deploy generates or reads outside the inventory directory.
    type: list
    elements: path
    default: []
  per_host:
    description:
      - With O(part=vars), one digest per host given (a mapping of host to digest) instead of one for all.
        A host's digest covers every host's groups and its own variables, so that a change to one host's
        variables makes that host's digest differ and no other's.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: This run's inputs
  ansible.builtin.set_fact:
    digest: >-
      {{ lookup('raymetal.cluster.deploy_inputs', part='files') }}-{{
         lookup('raymetal.cluster.deploy_inputs', groups['ray_cluster'], part='vars') }}

- name: One digest per host (a mapping), and the files half without those hosts' host_vars files
  ansible.builtin.set_fact:
    vars_digests: "{{ query('raymetal.cluster.deploy_inputs', groups['ray_cluster'], part='vars', per_host=true) | first }}"
    files_digest: "{{ lookup('raymetal.cluster.deploy_inputs', groups['ray_cluster'], part='files') }}"
"""

RETURN = r"""
_raw:
  description: The digest, one hex string; with O(per_host), one mapping of each host given to its digest.
  type: list
  elements: raw
"""

import hashlib
import json
import os

from ansible.errors import AnsibleLookupError
from ansible.module_utils.common.text.converters import to_bytes
from ansible.plugins.lookup import LookupBase
from ansible.release import __version__ as ANSIBLE_CORE_VERSION

# raymetal's own tree: this file is plugins/lookup/deploy_inputs.py in the
# repository and in the installed collection alike.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODE_DIRS = ("roles", "playbooks", "plugins")
# Directories of an inventory source that are not inputs (ansible.cfg ignores
# them as inventory too): the reports playbooks/acceptance.yml saves.
SKIP_DIRS = {"acceptance", "__pycache__", ".git"}
# Variables Ansible itself sets for a run (they differ between runs with the
# same inputs, or repeat what is hashed already).
RUN_VARS = {
    "omit", "playbook_dir", "inventory_dir", "inventory_file", "ansible_playbook_python", "ansible_config_file",
    "ansible_check_mode", "ansible_diff_mode", "ansible_forks", "ansible_run_tags", "ansible_skip_tags",
    "ansible_verbosity", "ansible_inventory_sources", "ansible_limit", "ansible_version", "ansible_facts",
    "ansible_search_path", "ansible_collection_name", "ansible_role_names", "ansible_play_role_names",
    "role_names", "groups", "vars", "environment", "ansible_local", "module_setup",
    # The fast path's own switch changes nothing on a node, nor does the budget of unreachable workers a deploy
    # may leave out (it decides which hosts run, not what they get): a degraded deploy keeps the fast path per
    # host on the nodes that did not change.
    "raymetal_fast_path", "raymetal_max_unreachable",
    # How long and over which socket the controller's SSH waits (-e ansible_timeout=5 for a run that expects a dead
    # host) changes nothing on a node either. Where to connect (ansible_host, ansible_port, ansible_user) stays an
    # input: it can be another machine.
    "ansible_timeout", "ansible_ssh_timeout", "ansible_ssh_retries", "ansible_control_path",
    "ansible_control_path_dir", "ansible_pipelining", "ansible_ssh_pipelining",
}


def _update_tree(digest, top, skip=()):
    """Every file under top, by path relative to it and content; symbolic links followed (an inventory that links
    its credentials digests as one that holds them), each real directory once; paths in skip left out."""
    seen = set()
    for current, dirs, files in os.walk(top, followlinks=True):
        real = os.path.realpath(current)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and os.path.join(current, d) not in skip)
        for name in sorted(files):
            if name.endswith((".pyc", ".retry")):
                continue
            path = os.path.join(current, name)
            if path in skip:
                continue
            digest.update(to_bytes(os.path.relpath(path, top)) + b"\0")
            try:
                with open(path, "rb") as handle:
                    digest.update(hashlib.sha256(handle.read()).digest())
            except OSError as exc:
                digest.update(to_bytes("unreadable %s" % exc.__class__.__name__))


def _update_path(digest, path, skip=(), name=None):
    if os.path.isdir(path):
        _update_tree(digest, path, skip)
    elif os.path.isfile(path):
        with open(path, "rb") as handle:
            digest.update(hashlib.sha256(handle.read()).digest())
    else:
        digest.update(to_bytes("not a file: " + (name or path)))


def host_vars_paths(source, hosts):
    """The host_vars files and directories of the given hosts in an inventory directory (Ansible reads
    host_vars/<host>, host_vars/<host>.yml, .yaml and .json): their content reaches a deploy only as those
    hosts' variables."""
    folder = os.path.join(source, "host_vars")
    if not hosts or not os.path.isdir(folder):
        return set()
    wanted = set(hosts)
    return set(os.path.join(folder, name) for name in os.listdir(folder)
               if name in wanted or (os.path.splitext(name)[1] in (".yml", ".yaml", ".json")
                                     and os.path.splitext(name)[0] in wanted))


def _within(path, sources):
    """path relative to the inventory directory that holds it (with that directory's name), else path itself."""
    path = os.path.normpath(path)
    for source in sources:
        top = os.path.normpath(source)
        if os.path.isdir(top) and path.startswith(top + os.sep):
            return os.path.join(os.path.basename(top), os.path.relpath(path, top))
    return path


def _kept(hostvars, host):
    raw = hostvars.raw_get(host)
    if not isinstance(raw, dict):
        raise AnsibleLookupError("deploy_inputs: %s is not an inventory host" % host)
    return dict((k, v) for k, v in raw.items() if k not in RUN_VARS)


def _dump(value):
    return to_bytes(json.dumps(value, sort_keys=True, default=str))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        self.set_options(var_options=variables, direct=kwargs)
        part = self.get_option("part")
        hosts = sorted(str(h) for h in (terms[0] if len(terms) == 1 and isinstance(terms[0], list) else terms))
        digest = hashlib.sha256()
        if part == "files":
            digest.update(to_bytes("ansible-core " + ANSIBLE_CORE_VERSION) + b"\0")
            for name in CODE_DIRS:
                digest.update(to_bytes("code " + name) + b"\0")
                _update_path(digest, os.path.join(ROOT, name))
            sources = sorted(variables.get("ansible_inventory_sources") or [])
            for source in sources:
                digest.update(to_bytes("inventory " + os.path.basename(os.path.normpath(source))) + b"\0")
                _update_path(digest, source, host_vars_paths(source, hosts))
            for path in self.get_option("extra_files") or []:
                # Named within its inventory (credentials/ray_token), so that a copy of the inventory elsewhere
                # holding the same files has the same inputs; elsewhere by its path.
                name = _within(path, sources)
                digest.update(to_bytes("file " + name) + b"\0")
                _update_path(digest, path, name=name)
            return [digest.hexdigest()]

        hostvars = variables.get("hostvars")
        if hostvars is None or not hasattr(hostvars, "raw_get"):
            raise AnsibleLookupError("deploy_inputs needs the play's hostvars; call it from a task.")
        kept = dict((host, _kept(hostvars, host)) for host in hosts)
        if self.get_option("per_host"):
            # What concerns every host: the groups of each (a host that joins the monitoring group changes what
            # the others scrape and admit); then each host's own variables.
            groups = hashlib.sha256()
            for host in hosts:
                groups.update(to_bytes("host " + host) + b"\0" + _dump(kept[host].get("group_names")))
            digests = {}
            for host in hosts:
                one = groups.copy()
                one.update(to_bytes("vars " + host) + b"\0" + _dump(kept[host]))
                digests[host] = one.hexdigest()
            return [digests]
        for host in hosts:
            digest.update(to_bytes("host " + host) + b"\0")
            digest.update(_dump(kept[host]))
        return [digest.hexdigest()]
