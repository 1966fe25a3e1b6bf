"""Machine-readable output stays clean: with the repository's ansible.cfg and
ANSIBLE_STDOUT_CALLBACK=json, a playbook run prints one JSON document, nothing
around it (no profile_tasks timing lines, no banners)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent

PLAYBOOK = """\
- name: A small play
  hosts: all
  gather_facts: false
  tasks:
    - name: Say something
      ansible.builtin.debug:
        msg: hello from raymetal
    - name: Use a project filter
      ansible.builtin.debug:
        msg: "{{ {} | raymetal.cluster.ipv4_by_interface }}"
"""


def test_json_callback_output_is_one_json_document(tmp_path):
    play = tmp_path / "small.yml"
    play.write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_NOCOLOR="1", PATH="%s%s%s" % (BIN, os.pathsep, os.environ.get("PATH", "")))
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=%s" % sys.executable, str(play)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)  # the whole of stdout, not a slice of it
    assert result["stats"]["localhost"]["ok"] == 2
    tasks = result["plays"][0]["tasks"]
    assert [t["task"]["name"] for t in tasks] == ["Say something", "Use a project filter"]
    assert tasks[0]["hosts"]["localhost"]["msg"] == "hello from raymetal"
