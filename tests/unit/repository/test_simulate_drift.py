"""bench/scale/simulate.py's drift recording (issue 37, goal 5): the answers a simulated cluster with one drifted
worker is replayed from, built from the fast path's and the full path's recordings of a real lab."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROBE = "applied_state"


@pytest.fixture(scope="module")
def simulate():
    spec = importlib.util.spec_from_file_location("simulate_bench", ROOT / "bench" / "scale" / "simulate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def answer(where, module, k, out, rc=0):
    path = where / module
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{k}.out").write_text(out if isinstance(out, str) else json.dumps(out))
    (path / f"{k}.rc").write_text(str(rc))


FRESH = {"changed": False, "fresh": True, "differs": [], "applied": {"ansible_facts": {"fabric": {"address": "10.0.0.2"}}},
         "ansible_facts": {"fabric": {"address": "10.0.0.2"}}, "recorded_at": "2026-11-29T00:00:00Z"}


def recordings(work):
    """A head and two workers: the fast path ran the probe alone; the full path ran a command twice and recorded
    the deploy (the probe's module again, with state=record) once."""
    for node in ("head", "w1", "w2"):
        answer(work / "rec-fast" / node, PROBE, 0, FRESH)
        answer(work / "rec-full" / node, "command", 0, {"stdout": f"{node} first"})
        answer(work / "rec-full" / node, "command", 1, {"stdout": f"{node} second"}, rc=2)
        answer(work / "rec-full" / node, PROBE, 0, {"changed": False, "fresh": True, "recorded": node})
    answer(work / "rec-fast" / "head", "ray_cluster_facts", 0, {"summary": "fast"})


def read(path):
    return json.loads(path.read_text())


def test_the_probe_answers_first_then_the_full_path_in_order(simulate, tmp_path):
    recordings(tmp_path)
    simulate.drift_recording(str(tmp_path), "w1")
    drift = tmp_path / "rec-drift"
    assert sorted(p.name for p in drift.iterdir()) == ["head", "w1", "w1-drifted", "w2"]
    for node in ("head", "w1", "w2"):
        assert read(drift / node / PROBE / "0.out") == FRESH
        assert read(drift / node / PROBE / "1.out") == {"changed": False, "fresh": True, "recorded": node}
        assert not (drift / node / PROBE / "2.out").exists()
        assert read(drift / node / "command" / "0.out") == {"stdout": f"{node} first"}
        assert (drift / node / "command" / "1.rc").read_text() == "2"
    # Only the full path's answers for everything but the probe: the fast path's summary is not replayed.
    assert not (drift / "head" / "ray_cluster_facts").exists()
    # The recordings themselves are left as they were.
    assert read(tmp_path / "rec-full" / "w1" / PROBE / "0.out") == {"changed": False, "fresh": True, "recorded": "w1"}


def test_the_drifted_copy_differs_from_its_record_and_publishes_no_facts(simulate, tmp_path):
    recordings(tmp_path)
    simulate.drift_recording(str(tmp_path), "w1")
    drifted = tmp_path / "rec-drift" / "w1-drifted"
    probe = read(drifted / PROBE / "0.out")
    assert probe["fresh"] is False and probe["differs"] and "ansible_facts" not in probe
    # Its record still publishes the address the plan compares with the node's.
    assert probe["applied"] == FRESH["applied"]
    assert read(drifted / PROBE / "1.out") == {"changed": False, "fresh": True, "recorded": "w1"}
    assert read(drifted / "command" / "1.out") == {"stdout": "w1 second"}
    # A second call starts again from the recordings (the directory of an earlier call is replaced).
    simulate.drift_recording(str(tmp_path), "w1")
    assert read(tmp_path / "rec-drift" / "w1" / PROBE / "1.out") == {"changed": False, "fresh": True, "recorded": "w1"}


def test_a_fast_recording_whose_probe_did_not_find_the_node_fresh_is_refused(simulate, tmp_path):
    recordings(tmp_path)
    answer(tmp_path / "rec-fast" / "w1", PROBE, 0, dict(FRESH, fresh=False, differs=["x"]))
    with pytest.raises(simulate.BenchError, match="did not find the node fresh"):
        simulate.drift_recording(str(tmp_path), "w1")


def test_an_unknown_worker_is_refused(simulate, tmp_path):
    recordings(tmp_path)
    with pytest.raises(simulate.BenchError, match="no recording of w9"):
        simulate.drift_recording(str(tmp_path), "w9")
