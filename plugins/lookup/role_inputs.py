# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""The digest of one role's inputs on one host, as resolved where the role runs."""

from __future__ import annotations

DOCUMENTATION = r"""
name: role_inputs
short_description: Digest of a role's inputs on a host, resolved (the full path per role)
version_added: "0.1.0"
description:
  - "The deploy's full path per role (C(playbooks/apply.yml)): each node's record (the C(applied_state) module)
    keeps this digest for the roles that the deploy may leave alone on a node whose settings changed but whose
    code, inventory files and watched state did not; the next deploy runs such a role only where its digest
    differs."
  - "Returns a SHA-256 digest (hex) of every variable the task sees whose name starts with one of the given
    prefixes followed by C(_) (a role's own settings, its defaults and the wiring role's values for it, which
    carry the role's prefix), each resolved as the role would resolve it. A variable that cannot be resolved at
    this point counts by the kind of its error, so that the digest stays the same between runs that resolve it
    the same way."
  - Never returns or prints a value, only the digest.
options:
  _terms:
    description: The prefixes, without the trailing C(_) (a role's name, and the names of the roles whose
      variables it reads directly).
    type: list
    elements: str
    required: true
  names:
    description:
      - Whole variable names to digest as well, whatever their prefix (a role's derived values that read other
        hosts, such as the targets Prometheus scrapes, resolved where the role runs).
    type: list
    elements: str
    default: []
    version_added: "0.1.0"
"""

EXAMPLES = r"""
- name: The firewall's inputs on this host
  ansible.builtin.set_fact:
    raymetal_role_inputs_firewall: "{{ lookup('raymetal.cluster.role_inputs', 'firewall') }}"

- name: The monitoring role's inputs, and its scrape targets, which it derives from every host's variables
  ansible.builtin.set_fact:
    raymetal_role_inputs_monitoring: >-
      {{ lookup('raymetal.cluster.role_inputs', 'monitoring', 'package_mirror', names=['__monitoring_jobs']) }}
"""

RETURN = r"""
_raw:
  description: The digest, one hex string.
  type: list
  elements: str
"""

import hashlib
import json

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_bytes
from ansible.plugins.lookup import LookupBase

# The digests themselves (set_fact'ed under this prefix) are no input of any role.
OWN = "raymetal_role_inputs_"


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        prefixes = tuple(sorted(set(str(t) + "_" for t in terms)))
        if not prefixes:
            raise AnsibleError("role_inputs: name at least one prefix (a role's name).")
        names = kwargs.get("names") or []
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise AnsibleError("role_inputs: names must be a list of variable names, got %r." % (names,))
        whole = set(names)
        digest = hashlib.sha256()
        for name in sorted(k for k in variables if isinstance(k, str) and (k.startswith(prefixes) or k in whole)
                           and not k.startswith(OWN)):
            try:
                value = self._templar.template(variables[name])
            except Exception as exc:  # noqa: BLE001 -- any error of resolving counts by its kind, never stops the run
                value = "unresolved: " + type(exc).__name__
            digest.update(to_bytes(name) + b"\0")
            digest.update(to_bytes(json.dumps(value, sort_keys=True, default=str)) + b"\0")
        return [digest.hexdigest()]
