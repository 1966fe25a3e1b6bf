"""The lab's no-false-quarantine check (tests/lab/labkit.py false_quarantines, run at the end of each lab session by
tests/lab/conftest.py): which of the health loop's lines and records count against a healthy node."""

from __future__ import annotations

import json
from pathlib import Path

from tests.lab import labkit

AGENT = Path(labkit.ROOT) / "roles" / "health" / "files" / "raymetal_health_agent.py"

# journalctl -o short-unix lines of raymetal-health, as the agent prints them (roles/health/files/raymetal_health_agent.py).
JOURNAL = {
    "w1": "\n".join([
        "1000.5 w1 python3[42]: w1 quarantined (transient, fabric): ib0 is down",
        "1100.0 w1 python3[42]: w1 re-admitted: its checks passed 4 rounds in a row",
        "2000.0 w1 python3[42]: w1 quarantined (transient, temp_dir): 10 MiB free in /tmp/ray, 1024 MiB wanted",
    ]),
    "w2": "2500.0 w2 python3[7]: w2 not quarantined, the circuit breaker is open: 1 of 1 places taken; finding: x",
    "head": "-- No entries --",
}


def run_with(states):
    def run(node, script):
        if script.startswith("journalctl"):
            assert "--since @900" in script, script
            return JOURNAL.get(node, "")
        return states.get(node, "")
    return run


def test_acts_inside_a_fault_window_are_expected_and_outside_it_are_named():
    found = labkit.false_quarantines(["head", "w1", "w2"], 900.7, [(990.0, 1200.0)], run=run_with({}))
    assert found == [
        "w1: 2000.0 w1 python3[42]: w1 quarantined (transient, temp_dir): 10 MiB free in /tmp/ray, 1024 MiB wanted",
        "w2: 2500.0 w2 python3[7]: w2 not quarantined, the circuit breaker is open: 1 of 1 places taken; finding: x",
    ]


def test_a_record_held_at_the_end_is_named_whatever_the_windows():
    record = {"class": "hardware", "check": "gpu", "finding": "0000:3a:00.0 lost"}
    states = {"w1": json.dumps({"record": record, "kmsg_seq": 3}), "w2": json.dumps({"record": None}), "head": ""}
    found = labkit.false_quarantines(["head", "w1", "w2"], 900, [(0.0, 9999.0)], run=run_with(states))
    assert found == ["w1: still quarantined at the end: " + json.dumps(record, sort_keys=True)]


def test_a_healthy_lab_passes():
    quiet = {"head": "", "w1": "", "w2": ""}

    def run(node, script):
        return "" if script.startswith("journalctl") else json.dumps({"record": None}) if node != "head" else ""
    assert labkit.false_quarantines(list(quiet), 900, [], run=run) == []


def test_every_line_the_check_looks_for_is_one_the_agent_prints():
    """A phrase the agent no longer prints would make the check pass whatever the loop did: each must be in it."""
    source = AGENT.read_text()
    assert [act for act in labkit.HEALTH_ACTS if act.strip() not in source] == []
