# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""What raymetal's modules support, said once (the attributes' descriptions come from ansible.builtin.action_common_attributes)."""

from __future__ import annotations


class ModuleDocFragment(object):

    # A module that only reads the node: check mode runs it as a normal run, there is nothing to diff.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

    # A module that also returns facts.
    FACTS = r"""
attributes:
  facts:
    support: full
"""

    # A module that writes files on the node: check mode reports what would change, and --diff shows it.
    FILES = r"""
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
"""
