# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""Ansible's linear strategy, run through Mitogen when Mitogen is installed.

Mitogen keeps one Python interpreter per host alive for the whole run instead
of starting a new one (and shipping a new AnsiballZ payload) for every task,
which is most of what a no-op deploy spends its time on. requirements.txt pins
it; without it this is exactly Ansible's own ``linear`` strategy.

Opt-in: ansible.cfg keeps Ansible's plain ``linear`` strategy (ansible-core
warns that third-party strategy plugins are deprecated) and only puts this
directory on ``strategy_plugins``. Select it for a run with
``ANSIBLE_STRATEGY=raymetal_linear ansible-playbook ...``.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: raymetal_linear
short_description: Linear strategy, through Mitogen when it is installed
description:
  - Runs Ansible's C(linear) strategy through Mitogen's connection multiplexer
    when the C(mitogen) package is importable on the controller, else runs the
    plain C(linear) strategy unchanged.
author:
  - raymetal contributors (@raymetal)
"""

try:
    import ansible_mitogen.loaders
    import ansible_mitogen.strategy
except ImportError:  # Mitogen is optional: fall back to Ansible's own strategy
    ansible_mitogen = None

from ansible.plugins.strategy.linear import StrategyModule as LinearStrategyModule

MITOGEN = ansible_mitogen is not None

if MITOGEN:
    class StrategyModule(ansible_mitogen.strategy.StrategyMixin,
                         ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)):
        """linear, with Mitogen's connection and module runner."""

else:
    class StrategyModule(LinearStrategyModule):
        """linear, unchanged (Mitogen is not installed)."""
