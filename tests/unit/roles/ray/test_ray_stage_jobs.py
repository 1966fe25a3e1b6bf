"""The ray role's stage (playbooks/upgrade.yml) lists the jobs a stop ends by ID and status only.

It printed each job's entrypoint (issue 35), and published the job API's whole answer (entrypoint, runtime_env,
metadata) as ray_running_jobs: a user's secrets may be in any of them. The two tasks of roles/ray/tasks/stage.yml
run here with ansible-playbook on this machine, with a recorded job API answer in place of the head's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[4]
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
SECRET = "hf_SECRETTOKEN123"
JOBS = [
    {"type": "SUBMISSION", "job_id": "02000000", "submission_id": "raysubmit_abc", "status": "RUNNING",
     "entrypoint": "python train.py --hf-token=" + SECRET, "start_time": 1764160000000,
     "runtime_env": {"env_vars": {"HF_TOKEN": SECRET}}, "metadata": {"note": SECRET}},
    {"type": "DRIVER", "job_id": "03000000", "submission_id": None, "status": "PENDING",
     "entrypoint": "python -c 'print(\"" + SECRET + "\")'"},
    {"type": "SUBMISSION", "job_id": "01000000", "submission_id": "raysubmit_old", "status": "SUCCEEDED",
     "entrypoint": "echo done"},
]


def run_stage(tmp_path, answer):
    """The two tasks, on this machine, with ``answer`` as the job API's registered answer: (output, published)."""
    stage = yaml.safe_load((ROOT / "roles" / "ray" / "tasks" / "stage.yml").read_text())
    tasks = [t for t in stage if t["name"] in ("Publish the jobs that a stop would end",
                                               "Show the jobs that will end when Ray stops")]
    assert len(tasks) == 2
    tasks.append({"name": "Write what was published", "ansible.builtin.copy": {
        "content": "{{ ray_running_jobs | to_json }}", "dest": str(tmp_path / "published.json"), "mode": "0600"}})
    play = [{"name": "Stage's job list", "hosts": "localhost", "gather_facts": False,
             "vars": {"__ray_stage_jobs": answer}, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_CACHE_PLUGIN="memory")
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", "-v",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(tmp_path / "play.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out, json.loads((tmp_path / "published.json").read_text())


def test_the_jobs_a_stop_ends_are_shown_and_published_without_entrypoints(tmp_path):
    out, published = run_stage(tmp_path, {"status": 200, "json": JOBS})
    assert "2 job(s) will end: raysubmit_abc (RUNNING); 03000000 (PENDING)" in " ".join(out.split()), out
    assert SECRET not in out and "train.py" not in out
    assert [j.get("submission_id") or j["job_id"] for j in published] == ["raysubmit_abc", "03000000"]
    assert SECRET not in json.dumps(published) and all("entrypoint" not in j for j in published)


def test_a_job_api_that_does_not_answer_is_not_reported_as_no_jobs(tmp_path):
    # It said "No running jobs" whatever the answer: an operator confirmed a stop that ended jobs nobody listed.
    refused = {"status": -1, "failed": True,
               "msg": "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>"}
    out, published = run_stage(tmp_path, refused)
    flat = " ".join(out.split())
    assert "No running jobs" not in flat and published == []
    assert "The jobs could not be listed (the head" in flat and "job API answered -1: Status code was -1" in flat, flat
    assert "any job that runs now will end when Ray stops" in flat
    out, _ = run_stage(tmp_path, {"status": 200, "json": []})
    assert "No running jobs." in " ".join(out.split())
