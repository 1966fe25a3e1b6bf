# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""Running a command with the C locale, so its output parses the same on every host."""

from __future__ import annotations

C_LOCALE = {"LANG": "C", "LC_ALL": "C", "LC_MESSAGES": "C"}


def run_c_locale(module, cmd, **extra):
    """Run cmd (a list) under the C locale; return stdout, or fail_json naming the command."""
    rc, out, err = module.run_command(cmd, environ_update=C_LOCALE)
    if rc != 0:
        module.fail_json(msg="'%s' failed with rc=%d: %s" % (" ".join(cmd), rc, (err or out).strip()),
                         rc=rc, **extra)
    return out
