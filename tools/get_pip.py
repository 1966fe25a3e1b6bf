"""Offline stand-in for the get-pip.py that ansible-test downloads.

ansible-test (tools/sanity.sh) makes a venv without pip for each sanity test
and bootstraps pip into it by running ~/.ansible/test/cache/get_pip_<ver>.py,
which it otherwise downloads from ci-files.testing.ansible.com (unreachable on
our machines). tools/sanity.sh puts this file there, beside the pinned pip
wheel it fetched from the Python index: pip installs itself from that wheel,
with no network.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# ansible-test's options that only the real get-pip.py knows: it never asks for setuptools or wheel.
GET_PIP_ONLY = ('--no-setuptools', '--no-wheel')


def main():
    """Install the requested pip (e.g. pip==24.2) from the wheel beside this file."""
    wheels = sorted(name for name in os.listdir(HERE) if name.startswith('pip-') and name.endswith('.whl'))
    if not wheels:
        sys.exit('no pip wheel in %s (tools/sanity.sh downloads it)' % HERE)
    sys.path.insert(0, os.path.join(HERE, wheels[-1]))
    from pip._internal.cli.main import main as pip_main  # pylint: disable=import-outside-toplevel
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
    sys.exit(pip_main(['install', '--no-index', '--find-links', HERE] + args))


if __name__ == '__main__':
    main()
