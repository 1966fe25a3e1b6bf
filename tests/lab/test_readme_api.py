"""Run the Python API example (docs/api_example.py, included verbatim in docs/api.md) against the lab.

Needs the lab up and Ray deployed on it (`lab/lab.sh up`, then site.yml with -i inventory/lab).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.lab
def test_readme_api_example_against_lab(cluster):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "docs/api_example.py", "inventory/lab"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Ray 2.60.0: "), proc.stdout
    alive = int(lines[0].split(": ")[1].split()[0])
    assert alive >= 1
    assert sum(1 for line in lines[1:] if line.split()[-1] == "ALIVE") == alive
