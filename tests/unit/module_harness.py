"""One harness for the modules' unit tests (community.general's pattern, ansible-core 2.19+).

run_module(module, args) sets the module's arguments with
ansible.module_utils.testing.patch_module_args, turns exit_json/fail_json into
exceptions, and returns (ExitJson or FailJson, result dict). Tests import the
modules by collection path (ansible_collections.raymetal.cluster.plugins.modules,
importable through pytest.ini's pythonpath), as their module_utils do.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]


class ExitJson(Exception):
    """exit_json was called; .result holds its arguments."""

    def __init__(self, result):
        super().__init__(result)
        self.result = result


class FailJson(Exception):
    """fail_json was called; .result holds its arguments (msg included)."""

    def __init__(self, result):
        super().__init__(result.get("msg"))
        self.result = result


def _exit_json(self, **kwargs):
    raise ExitJson(kwargs)


def _fail_json(self, **kwargs):
    raise FailJson(kwargs)


def run_module(module, args, run_command=None):
    """Run module.main() with args; return (ExitJson or FailJson, result).

    run_command, if given, replaces AnsibleModule.run_command (same signature).
    """
    patches = [mock.patch.multiple(basic.AnsibleModule, exit_json=_exit_json, fail_json=_fail_json)]
    if run_command is not None:
        patches.append(mock.patch.object(basic.AnsibleModule, "run_command", run_command))
    with patch_module_args(args):
        for patch in patches:
            patch.start()
        try:
            module.main()
        except (ExitJson, FailJson) as outcome:
            return type(outcome), outcome.result
        finally:
            for patch in reversed(patches):
                patch.stop()
    raise AssertionError("%s.main() returned without exit_json or fail_json" % module.__name__)
