# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""ansible.builtin.template's lookup, given a shallow copy of the task's variables instead of a deep one."""

from __future__ import annotations

DOCUMENTATION = r"""
name: render
short_description: Render role templates as ansible.builtin.template's lookup does, without deep-copying every variable
version_added: "0.1.0"
description:
  - "Returns, for each template named, its content rendered with the task's variables: the same search path, the
    same C(template_*) variables and the same result as the C(ansible.builtin.template) lookup, which this one runs."
  - "The only difference is the copy of the variables the template sees. For every template, C(ansible.builtin.template)
    deep-copies all of the host's variables (its own code notes that a layer on top would do) only to add the
    C(template_*) names and O(template_vars) on top of them; with ansible-core 2.19's tagged values that copy was
    about a tenth of the controller's CPU in a deploy that writes every node's files (the roles render their
    configuration files in one task per role). This lookup hands it a shallow copy: the task's own variables are
    never changed either way, as the template lookup only adds names to its copy."
  - Used by raymetal's roles for the templates they write through C(raymetal.cluster.node_files); any other template
    lookup works the same with C(ansible.builtin.template).
options:
  _terms:
    description: The templates to render, found as C(ansible.builtin.template) finds them (a role's C(templates/)).
    type: list
    elements: str
    required: true
  template_vars:
    description: More variables for the templates, on top of the task's.
    type: dict
    default: {}
  variable_start_string:
    description: The string marking the beginning of a print statement.
    type: str
    default: "{{"
  variable_end_string:
    description: The string marking the end of a print statement.
    type: str
    default: "}}"
  comment_start_string:
    description: The string marking the beginning of a comment statement.
    type: str
    default: "{#"
  comment_end_string:
    description: The string marking the end of a comment statement.
    type: str
    default: "#}"
  trim_blocks:
    description: Whether the first newline after a block is removed.
    type: bool
    default: true
seealso:
  - plugin: ansible.builtin.template
    plugin_type: lookup
"""

EXAMPLES = r"""
- name: Write the node's files
  raymetal.cluster.node_files:
    files:
      - path: /etc/ray/ray.env
        content: "{{ lookup('raymetal.cluster.render', 'ray.env.j2') }}"
"""

RETURN = r"""
_raw:
  description: Each template's rendered content, in the order given.
  type: list
  elements: raw
"""

from ansible.plugins.lookup.template import LookupModule as TemplateLookup


class _ShallowCopied(dict):
    """The task's variables for one render: deepcopy() of them returns a shallow copy (a plain dict)."""

    def __deepcopy__(self, memo):
        return dict(self)


class LookupModule(TemplateLookup):
    def run(self, terms, variables=None, **kwargs):
        return super().run(terms, variables=_ShallowCopied(variables or {}), **kwargs)
