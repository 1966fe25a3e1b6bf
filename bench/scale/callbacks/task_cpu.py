# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""Controller CPU per task of one ansible-playbook run, for bench/scale/task_cpu.py (not shipped, not enabled).

At every task start, the CPU that ansible-playbook and its reaped children (the forked workers and their ssh
processes) used since the previous task start is charged to the previous task, with how many hosts it ran on
and how many of those skipped it. Written as TSV to $RAYMETAL_TASK_CPU_OUT when the run ends.
"""

from __future__ import annotations

import os
import resource

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: task_cpu
type: aggregate
short_description: Controller CPU seconds per task (bench only)
description:
  - Charges the controller CPU (ansible-playbook and its reaped children) between two task starts to the first task.
  - Writes one TSV line per task to the file named by E(RAYMETAL_TASK_CPU_OUT) at the end of the run.
requirements:
  - enabled with ANSIBLE_CALLBACKS_ENABLED=task_cpu and ANSIBLE_CALLBACK_PLUGINS=bench/scale/callbacks
"""


def _cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_cpu"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._rows = []
        self._current = None
        self._play = ""
        self._hosts = 0
        self._skipped = 0
        self._start = _cpu()

    def _close(self):
        now = _cpu()
        if self._current is not None:
            name, since = self._current
            self._rows.append((now - since, self._hosts, self._skipped, self._play, name))
        self._hosts = self._skipped = 0
        return now

    def v2_playbook_on_play_start(self, play):
        self._current = ("(play start)", self._close())
        self._play = play.get_name()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._current = (task.get_name(), self._close())

    def v2_runner_on_ok(self, result, **kwargs):
        self._hosts += 1

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._hosts += 1

    def v2_runner_on_unreachable(self, result):
        self._hosts += 1

    def v2_runner_on_skipped(self, result):
        self._hosts += 1
        self._skipped += 1

    def v2_playbook_on_stats(self, stats):
        now = self._close()
        self._current = None
        path = os.environ.get("RAYMETAL_TASK_CPU_OUT")
        if not path:
            return
        with open(path, "w", encoding="utf-8") as out:
            out.write("# total\t%.3f\n" % (now - self._start))
            for cpu, hosts, skipped, play, name in self._rows:
                out.write("%.3f\t%d\t%d\t%s\t%s\n" % (cpu, hosts, skipped, play.replace("\t", " "), name.replace("\t", " ")))
