#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""Put several directories and small files in place on a node in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_files
short_description: Directories and small text files, each with its owner, group and mode, in one round trip
version_added: "0.3.0"
description:
  - Puts every entry of O(files) in place in one module run, so one round trip to the node instead of one
    (or two) per file with M(ansible.builtin.template) or M(ansible.builtin.copy). Roles render the
    contents on the controller (C(lookup('ansible.builtin.template', ...)),
    C(lookup('ansible.builtin.file', ...))) and hand them over here.
  - A file is written (to a temporary file beside it, then renamed over it) only when its content
    differs; owner, group and mode are set when they differ. A directory is created when missing
    (its parents too, as C(mkdir -p)), then given its owner, group and mode.
  - Entries are handled in the order given, so a directory listed before the files in it exists first.
  - "Returns which paths changed (RV(changed_paths)), so that a role can tell which of its files
    changed (a restart reason each) from one result."
  - Supports check mode (nothing is written; what would change is reported) and diff mode (a diff
    per changed file, left out for the files marked O(files[].secret)).
  - Ansible logs every module run with its arguments on the node (the journal, or syslog), and shows them in
    the result at C(-vvv). So the content of a file that holds a secret (a private key, a file with a password)
    goes in O(secrets), which is never logged, shown or returned, never in O(files[].content).
  - For small configuration files and scripts (their content travels as a module argument);
    large or binary files belong to M(ansible.builtin.copy) or M(ansible.posix.synchronize).
options:
  files:
    description: What to put in place.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path.
        type: path
        required: true
      state:
        description:
          - C(file) writes O(files[].content); C(directory) makes a directory; C(absent) removes a file
            that should no longer be there, or a directory that carries O(files[].marker) (never one without).
        type: str
        choices: [file, directory, absent]
        default: file
      content:
        description:
          - The file's whole content (text). Required for C(state=file), unless O(files[].secret) is set.
          - Logged with the module's other arguments on the node and shown in the diff, so never a secret.
        type: str
      owner:
        description: Owner name; unset leaves it as it is (root for a new file).
        type: str
      group:
        description: Group name; unset leaves it as it is.
        type: str
      mode:
        description: Mode as an octal string (C('0644')); unset leaves it as it is (umask for a new file).
        type: raw
      secret:
        description:
          - Whether the file holds a secret (a key, a token, a password). Its content is then
            the value of O(secrets) for its path, never O(files[].content), and it has no diff.
          - V(true) with O(files[].content) is refused, since that content has been logged on the node by then.
        type: bool
        default: false
      marker:
        description:
          - A file name. With C(state=directory), a file of that name is written into the directory when
            this module makes it (or finds it empty, or owned already by O(files[].owner), not root, as an
            earlier raymetal left it); a directory that holds other files, lacks the marker and belongs to
            someone else is refused, not taken over.
          - With C(state=absent), a directory is removed with everything in it only if it carries the
            marker; an empty one without it is removed too; one that holds files but no marker is refused
            (the task fails and nothing is removed), so that a setting pointing at someone's data
            (C(/home)) never deletes it.
        type: str
      validate:
        description:
          - A command that checks the new content before it replaces the file, run on the temporary file
            written beside it (C(%s) in the command is its path), as M(ansible.builtin.template)'s
            C(validate) does. A non-zero exit leaves the file as it was and fails the task with the
            command's output. Not run in check mode, nor when the content is unchanged.
        type: str
  secrets:
    description:
      - The contents of the files marked O(files[].secret), by path. Never logged on the node, shown in a diff or
        returned (Ansible masks each of them in the result).
    type: dict
    default: {}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - raymetal.cluster.attributes.files
author:
  - raymetal contributors (@raymetal)
"""

EXAMPLES = r"""
- name: Write the unit, its environment and a helper in one round trip
  raymetal.cluster.node_files:
    files:
      - {path: /etc/ray, state: directory, owner: root, group: ray, mode: "0750"}
      - {path: /etc/ray/ray.env, content: "{{ lookup('ansible.builtin.template', 'ray.env.j2') }}",
         owner: root, group: ray, mode: "0640"}
      - {path: /etc/systemd/system/ray-head.service, content: "{{ lookup('ansible.builtin.template', 'ray.service.j2') }}",
         owner: root, group: root, mode: "0644"}
  register: ray_files

- name: Restart when the unit changed
  ansible.builtin.debug:
    msg: the unit changed
  when: "'/etc/systemd/system/ray-head.service' in ray_files.changed_paths"
"""

RETURN = r"""
changed_paths:
  description: The paths whose content, owner, group or mode changed (or would, in check mode), in the given order.
  returned: always
  type: list
  elements: str
  sample: [/etc/ray/ray.env]
created:
  description: The paths that did not exist before.
  returned: always
  type: list
  elements: str
  sample: []
"""

import os
import pwd
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_text


def _read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _write(module, path, data, validate=None):
    """Write data beside path, check it with `validate` (if given), and rename it over path (atomic for readers)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if validate:
            if "%s" not in validate:
                module.fail_json(msg="files: %s: validate must contain %%s (the file to check): %r" % (path, validate))
            rc, out, err = module.run_command(validate % tmp)
            if rc != 0:
                module.fail_json(msg="%s: the new content failed validation (%s, rc=%d): %s"
                                 % (path, validate, rc, (err or out).strip()), path=path)
        module.atomic_move(tmp, path)
    except Exception:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _attributes(module, entry, changed):
    """Set owner, group and mode where given; returns whether any differed (check mode: would differ)."""
    path = entry["path"]
    mode = entry.get("mode")
    if entry.get("owner"):
        changed = module.set_owner_if_different(path, entry["owner"], changed)
    if entry.get("group"):
        changed = module.set_group_if_different(path, entry["group"], changed)
    if mode is not None:
        changed = module.set_mode_if_different(path, mode, changed)
    return changed


MARKER_TEXT = b"Made by raymetal, which may empty or remove this directory. Do not keep other data here.\n"


def _not_ours(path, marker):
    return ("%s holds files but not raymetal's marker %s, so raymetal did not make it and will not remove or "
            "take it over. Fix: point the setting at a new directory (raymetal makes it), or, if this directory "
            "is raymetal's and holds nothing else, create the marker: touch %s"
            % (path, marker, os.path.join(path, marker)))


def _remove_dir(module, entry):
    """Remove a directory that carries entry's marker (or is empty); returns (changed, created, diff)."""
    path, marker = entry["path"], entry.get("marker")
    if not marker:
        module.fail_json(msg="%s is a directory; state=absent removes files only (or a directory with a marker)" % path)
    if not os.path.lexists(os.path.join(path, marker)) and os.listdir(path):
        module.fail_json(msg=_not_ours(path, marker), path=path)
    if not module.check_mode:
        shutil.rmtree(path)
    return True, False, {"before_header": path, "after_header": path, "before": "(directory)\n",
                         "after": "(absent)\n"}


def _mark(module, entry, created):
    """Write entry's marker into its directory where raymetal may claim it; returns whether it wrote one."""
    path, marker = entry["path"], entry.get("marker")
    if not marker:
        return False
    mark = os.path.join(path, marker)
    if os.path.lexists(mark):
        return False
    if not created and os.listdir(path):
        owner = entry.get("owner")
        try:
            owned = owner not in (None, "root") and pwd.getpwuid(os.stat(path).st_uid).pw_name == owner
        except KeyError:
            owned = False
        if not owned:
            module.fail_json(msg=_not_ours(path, marker), path=path)
    if not module.check_mode:
        _write(module, mark, MARKER_TEXT)
        os.chmod(mark, 0o444)
    return True


def put(module, entry):
    """Put one entry in place; returns (changed, created, diff or None)."""
    path = entry["path"]
    check = module.check_mode
    if entry["state"] == "absent":
        if os.path.isdir(path) and not os.path.islink(path):
            return _remove_dir(module, entry)
        if not os.path.lexists(path):
            return False, False, None
        if not check:
            os.unlink(path)
        return True, False, {"before_header": path, "after_header": path, "before": "(present)\n",
                             "after": "(absent)\n"}
    if entry["state"] == "directory":
        if os.path.isdir(path):
            marked = _mark(module, entry, False)
            return _attributes(module, entry, marked), False, None
        if os.path.exists(path):
            module.fail_json(msg="%s exists and is not a directory; remove it or choose another path" % path)
        if check:
            return True, True, {"before_header": path, "after_header": path, "before": "(absent)\n",
                                "after": "(directory)\n"}
        os.makedirs(path)
        _attributes(module, entry, True)
        _mark(module, entry, True)
        return True, True, None
    content = module.params["secrets"].get(path) if entry.get("secret") else entry.get("content")
    if content is None:
        module.fail_json(msg="files: %s has state=file but no content%s"
                         % (path, " (a secret file's content is secrets[path])" if entry.get("secret") else ""))
    wanted = to_bytes(content, errors="surrogate_or_strict")
    if os.path.isdir(path):
        module.fail_json(msg="%s is a directory; a file was asked for" % path)
    current = _read(path)
    created = current is None
    changed = current != wanted
    diff = None
    if changed and not entry.get("secret"):
        diff = {"before_header": path, "after_header": path,
                "before": "" if created else to_text(current, errors="surrogate_or_replace"),
                "after": to_text(wanted, errors="surrogate_or_replace")}
    if changed and check:
        # Attributes of a file not written yet cannot be compared: it will be changed anyway.
        if not created:
            _attributes(module, entry, True)
        return True, created, diff
    if changed:
        _write(module, path, wanted, entry.get("validate"))
    return _attributes(module, entry, changed), created, diff


def main():
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type="list", elements="dict", required=True, options=dict(
                path=dict(type="path", required=True),
                state=dict(type="str", choices=["file", "directory", "absent"], default="file"),
                content=dict(type="str"),
                owner=dict(type="str"),
                group=dict(type="str"),
                mode=dict(type="raw"),
                secret=dict(type="bool", default=False, no_log=False),
                validate=dict(type="str"),
                marker=dict(type="str"),
            )),
            secrets=dict(type="dict", default={}, no_log=True),
        ),
        supports_check_mode=True,
    )
    # secrets is no_log: Ansible leaves it out of the log it writes on the node and masks each content in the
    # result. (A no_log suboption of files would not do: the log holds the list's repr, where a multi-line
    # value no longer matches.) A secret given as content has been logged already: refuse it, so that the
    # role is fixed.
    for entry in module.params["files"]:
        if entry.get("secret") and entry.get("content") is not None:
            module.no_log_values.add(entry["content"])
            module.fail_json(msg="files: %s is marked secret but its content was given as content, which Ansible "
                                 "logs on the node with the module's arguments; give it in secrets (by path)"
                                 % entry["path"], path=entry["path"])
    changed_paths, created, diffs = [], [], []
    for entry in module.params["files"]:
        if not os.path.isabs(entry["path"]):
            module.fail_json(msg="files: %r is not an absolute path" % entry["path"])
        changed, was_created, diff = put(module, entry)
        if changed:
            changed_paths.append(entry["path"])
        if was_created:
            created.append(entry["path"])
        if diff:
            diffs.append(diff)
    result = dict(changed=bool(changed_paths), changed_paths=changed_paths, created=created)
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
