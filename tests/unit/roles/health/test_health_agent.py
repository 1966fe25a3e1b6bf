"""The health loop's agent (roles/health/files/raymetal_health_agent.py) with stand-ins for systemctl and the drain.

The health role installs it (issue 36); these tests pin what one round does with what the round
decides: drain (not for a node off the fabric), then stop the Ray unit, the record and the metric;
re-admission starts the unit; the head is only reported.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
H200 = ROOT / "tests" / "fixtures" / "nvidia" / "recorded-h200-vm"
HEALTH_CSV = (H200 / "smi-health.csv").read_text()


def load_agent(tmp_path):
    """The agent as installed: raymetal_health.py beside it."""
    (tmp_path / "lib").mkdir()
    shutil.copy(ROOT / "roles" / "health" / "files" / "raymetal_health_agent.py", tmp_path / "lib")
    shutil.copy(ROOT / "plugins" / "module_utils" / "raymetal_health.py", tmp_path / "lib")
    spec = importlib.util.spec_from_file_location("raymetal_health_agent", tmp_path / "lib" / "raymetal_health_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop("raymetal_health", None)
    return module


def recorder(tmp_path, name, rc=0):
    """A stand-in command that appends its arguments to calls.log and exits rc."""
    script = tmp_path / name
    script.write_text('#!/bin/sh\necho "%s $*" >> %s\nexit %d\n' % (name, tmp_path / "calls.log", rc))
    script.chmod(0o755)
    return str(script)


def systemctl(tmp_path, state="active", enabled=True):
    """A stand-in systemctl for one unit: start and stop (and kill) are appended to calls.log and set the unit's
    ActiveState (``show --property=ActiveState --value`` answers it); ``is-enabled`` answers enabled or disabled.
    Queries go to queries.log, so that calls.log holds only what changes something."""
    (tmp_path / "unit.state").write_text(state + "\n")
    (tmp_path / "unit.enabled").write_text(("enabled" if enabled else "disabled") + "\n")
    script = tmp_path / "systemctl"
    script.write_text(
        '#!/bin/sh\n'
        'd=%s\n'
        'case "$1" in\n'
        '  show) echo "systemctl $*" >> $d/queries.log; cat $d/unit.state; exit 0;;\n'
        '  is-enabled) echo "systemctl $*" >> $d/queries.log; cat $d/unit.enabled;'
        ' [ "$(cat $d/unit.enabled)" = enabled ]; exit $?;;\n'
        '  start) echo active > $d/unit.state;;\n'
        '  stop) echo inactive > $d/unit.state;;\n'
        'esac\n'
        'echo "systemctl $*" >> $d/calls.log\n' % tmp_path)
    script.chmod(0o755)
    return str(script)


def config(tmp_path, **extra):
    net = tmp_path / "sys" / "class" / "net" / "ib0"
    net.mkdir(parents=True, exist_ok=True)
    (net / "operstate").write_text("up\n")
    base = {"role": "worker", "host": "w1", "interface": "ib0", "address": "10.10.0.2", "gpus": [],
            "sysfs_root": str(tmp_path / "sys"), "readmit_passes": 2, "unit": "ray-worker.service",
            "state_path": str(tmp_path / "state" / "health.json"), "metrics_dir": str(tmp_path / "textfile"),
            "systemctl": systemctl(tmp_path),
            "drain": {"python": "/bin/sh", "script": recorder(tmp_path, "drain"), "dashboard_url": "http://10.10.0.1:8265",
                      "gcs": "10.10.0.1:6379", "token_path": "/etc/ray/auth_token", "deadline_s": 5, "ray_bin": "ray"}}
    base.update(extra)
    return base


def inputs(addresses=("10.10.0.2",)):
    return {"smi": lambda: [], "kmsg": lambda after: [], "driver_gpus": lambda: None,
            "addresses": lambda interface: list(addresses)}


def calls(tmp_path):
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_failing_round_drains_then_stops_ray_and_keeps_the_record(tmp_path, capsys):
    agent = load_agent(tmp_path)
    # Ray's temp dir short of space: the node still reaches the head, so it is drained first.
    cfg = config(tmp_path, temp_dir=str(tmp_path), min_free_bytes=2 ** 62)
    state, findings, action = agent.one_round(cfg, 100, inputs())
    assert action == "quarantine"
    made = calls(tmp_path)
    # The drain first (this node's address, the token's path, the deadline), then the unit stopped.
    assert made[0].startswith("drain http://10.10.0.1:8265 10.10.0.1:6379 10.10.0.2 /etc/ray/auth_token 5 ray raymetal health: ")
    assert made[1] == "systemctl stop ray-worker.service"
    record = json.loads(Path(cfg["state_path"]).read_text())["record"]
    assert (record["class"], record["check"], record["drain"], record["stopped"]) == (
        "transient", "temp_dir", "drained", True)
    assert "w1 quarantined (transient, temp_dir): Ray's temp dir %s has" % tmp_path in capsys.readouterr().out
    prom = (tmp_path / "textfile" / "raymetal_health.prom").read_text()
    assert 'raymetal_health_quarantined{class="transient",check="temp_dir"} 1' in prom
    assert "raymetal_health_findings 1" in prom


def test_a_node_off_the_fabric_is_stopped_without_a_drain_it_could_not_send(tmp_path, capsys):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path)
    state, findings, action = agent.one_round(cfg, 100, inputs(addresses=()))
    assert action == "quarantine"
    # The drain would go to the head over the fabric this node lost: no drain. Ray's own stop would try the same
    # for 30 s, so the stop is queued and the unit's processes killed, then the stop waited for.
    assert calls(tmp_path) == ["systemctl stop --no-block ray-worker.service",
                               "systemctl kill --signal=SIGKILL ray-worker.service",
                               "systemctl stop ray-worker.service"]
    record = json.loads(Path(cfg["state_path"]).read_text())["record"]
    assert (record["class"], record["check"], record["stopped"], record["killed"]) == (
        "transient", "fabric_address", True, True)
    assert record["drain"].startswith("not asked: the fabric is down here")
    assert "w1 quarantined (transient, fabric_address): the fabric interface ib0 lost 10.10.0.2" in capsys.readouterr().out
    prom = (tmp_path / "textfile" / "raymetal_health.prom").read_text()
    assert 'raymetal_health_quarantined{class="transient",check="fabric_address"} 1' in prom


def test_passing_rounds_in_a_row_readmit_and_start_ray(tmp_path, capsys):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path)
    agent.one_round(cfg, 100, inputs(addresses=()))
    assert agent.one_round(cfg, 115, inputs())[2] == "hold"
    state, _, action = agent.one_round(cfg, 130, inputs())
    assert (action, state["record"]) == ("readmit", None)
    assert calls(tmp_path)[-1] == "systemctl start ray-worker.service"
    assert "w1 re-admitted: its checks passed 2 rounds in a row" in capsys.readouterr().out
    assert 'raymetal_health_quarantined{class="",check=""} 0' in (tmp_path / "textfile" / "raymetal_health.prom").read_text()


def test_the_head_is_reported_and_nothing_is_stopped(tmp_path, capsys):
    agent = load_agent(tmp_path)
    ecc = HEALTH_CSV.replace("Enabled, 0, 0,", "Enabled, 1, 1,")
    read = dict(inputs(), smi=lambda: agent.health.parse_smi_health(ecc), driver_gpus=lambda: ["0000:00:06.0"])
    state, _, action = agent.one_round(config(tmp_path, role="head", gpus=["0000:00:06.0"]), 100, read)
    assert action == "report" and calls(tmp_path) == []
    assert "w1 is sick (the loop never stops the head)" in capsys.readouterr().out


def test_a_failed_stop_is_kept_in_the_record(tmp_path):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path, drain={})
    cfg["systemctl"] = recorder(tmp_path, "failing-systemctl", rc=5)
    state, _, action = agent.one_round(cfg, 100, inputs(addresses=()))
    assert action == "quarantine" and state["record"]["stopped"] is False
    assert calls(tmp_path)[-1] == "failing-systemctl stop ray-worker.service"


def test_a_quarantined_worker_whose_ray_runs_again_is_drained_and_stopped_again(tmp_path, capsys):
    """The Ray unit stays enabled through a quarantine, so a reboot starts Ray again (so does a start by hand, or
    activating: a worker's unit waiting for the head): the loop's next round drains and stops it again."""
    agent = load_agent(tmp_path)
    cfg = config(tmp_path, temp_dir=str(tmp_path), min_free_bytes=2 ** 62)
    agent.one_round(cfg, 100, inputs())
    assert calls(tmp_path)[-1] == "systemctl stop ray-worker.service"
    # The record holds and Ray stays stopped: nothing is done again.
    assert agent.one_round(cfg, 115, inputs())[2] == "hold" and len(calls(tmp_path)) == 2
    for running in ("active", "activating"):
        (tmp_path / "unit.state").write_text(running + "\n")
        state, _, action = agent.one_round(cfg, 130, inputs())
        assert action == "hold" and calls(tmp_path)[-2:] == [calls(tmp_path)[0], "systemctl stop ray-worker.service"]
        assert (tmp_path / "unit.state").read_text().strip() == "inactive"
    assert state["record"]["stopped_again"] == 2 and state["record"]["check"] == "temp_dir"
    assert ("w1 is quarantined (transient, temp_dir) but its Ray was running (started at boot or by hand): stopped "
            "again") in capsys.readouterr().out


def test_a_quarantine_that_turns_hardware_while_ray_runs_is_said_and_stopped_again(tmp_path, capsys):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path, temp_dir=str(tmp_path), min_free_bytes=2 ** 62, gpus=["0000:00:06.0"])
    healthy = dict(inputs(), smi=lambda: agent.health.parse_smi_health(HEALTH_CSV), driver_gpus=lambda: ["0000:00:06.0"])
    assert agent.one_round(cfg, 100, healthy)[2] == "quarantine"
    (tmp_path / "unit.state").write_text("active\n")
    ecc = HEALTH_CSV.replace("Enabled, 0, 0,", "Enabled, 1, 1,")
    state, _, action = agent.one_round(cfg, 115, dict(healthy, smi=lambda: agent.health.parse_smi_health(ecc)))
    assert action == "worse" and state["record"]["class"] == "hardware" and state["record"]["stopped_again"] == 1
    assert calls(tmp_path)[-1] == "systemctl stop ray-worker.service"
    out = capsys.readouterr().out
    assert "w1 now has a hardware fault: " in out and "but its Ray was running" in out


def test_the_head_holding_a_record_is_never_stopped(tmp_path):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path, role="head", temp_dir=str(tmp_path), min_free_bytes=2 ** 62)
    assert agent.one_round(cfg, 100, inputs())[2] == "report"
    assert agent.one_round(cfg, 115, inputs())[2] == "hold"
    assert calls(tmp_path) == [] and (tmp_path / "unit.state").read_text().strip() == "active"


def test_a_quarantine_lifted_while_the_cluster_is_stopped_leaves_ray_stopped(tmp_path, capsys):
    """playbooks/stop.yml disables the Ray units so that a stopped cluster stays down: a transient quarantine lifted
    meanwhile clears the record and starts nothing (site.yml starts Ray there with the rest)."""
    agent = load_agent(tmp_path)
    cfg = config(tmp_path)
    agent.one_round(cfg, 100, inputs(addresses=()))
    (tmp_path / "unit.enabled").write_text("disabled\n")
    agent.one_round(cfg, 115, inputs())
    state, _, action = agent.one_round(cfg, 130, inputs())
    assert (action, state["record"]) == ("readmit", None)
    assert "systemctl start ray-worker.service" not in calls(tmp_path)
    assert (tmp_path / "unit.state").read_text().strip() == "inactive"
    assert ("w1 re-admitted: its checks passed 2 rounds in a row; Ray not started: its unit ray-worker.service is "
            "disabled") in capsys.readouterr().out


# An operator's re-admission (--readmit, run by playbooks/readmit.yml with the loop stopped).
XID79 = ("4,900,99000000,c;NVRM: Xid (PCI:0000:00:06): 79, pid=0, name=python3, "
         "GPU has fallen off the bus.")
HARDWARE_RECORD = {"state": "quarantined", "class": "hardware", "check": "gpu_xid", "subject": "0000:00:06.0",
                   "finding": "Xid 79 on 0000:00:06.0", "since": 50, "passes": 0}


def held(tmp_path, cfg, record=HARDWARE_RECORD, kmsg_seq=800):
    path = Path(cfg["state_path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"record": record, "kmsg_seq": kmsg_seq}))


def state_of(cfg):
    return json.loads(Path(cfg["state_path"]).read_text())


def test_readmit_refuses_while_the_gpu_is_still_lost_and_keeps_the_record(tmp_path):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path, gpus=["0000:00:06.0"])
    held(tmp_path, cfg)
    read = dict(inputs(), driver_gpus=lambda: [])
    code, out = agent.operator_readmit(cfg, 200, read)
    result = json.loads(out)
    assert (code, result["verdict"]) == (3, "refused")
    assert [f["check"] for f in result["findings"]] == ["gpu_lost"]
    assert state_of(cfg) == {"record": HARDWARE_RECORD, "kmsg_seq": 800}
    assert calls(tmp_path) == []


def test_readmit_refuses_a_new_xid_but_not_the_one_that_caused_the_quarantine(tmp_path):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path, gpus=["0000:00:06.0"])
    held(tmp_path, cfg, kmsg_seq=899)
    record = agent.health.parse_kmsg_record(XID79)

    def kmsg(after):
        return [r for r in [record] if r["seq"] > after]

    ok = dict(inputs(), driver_gpus=lambda: ["0000:00:06.0"], kmsg=kmsg)
    code, out = agent.operator_readmit(cfg, 200, ok)
    assert (code, json.loads(out)["verdict"]) == (3, "refused")
    assert "79" in json.loads(out)["findings"][0]["message"]
    # The loop's cursor past that line (the Xid that caused the quarantine): the repaired GPU is admitted.
    held(tmp_path, cfg, kmsg_seq=900)
    code, out = agent.operator_readmit(cfg, 300, ok)
    assert (code, json.loads(out)["verdict"]) == (0, "admitted")


def test_readmit_after_the_repair_clears_the_record_keeps_the_cursor_and_starts_ray(tmp_path):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path, gpus=["0000:00:06.0"])
    held(tmp_path, cfg)
    code, out = agent.operator_readmit(cfg, 200, dict(inputs(), driver_gpus=lambda: ["0000:00:06.0"]))
    result = json.loads(out)
    assert (code, result["verdict"], result["ray_started"]) == (0, "admitted", True)
    assert result["record"] == HARDWARE_RECORD
    assert state_of(cfg) == {"record": None, "kmsg_seq": 800}
    assert calls(tmp_path) == ["systemctl start ray-worker.service"]
    assert 'raymetal_health_quarantined{class="",check=""} 0' in (tmp_path / "textfile" / "raymetal_health.prom").read_text()


def test_readmit_of_a_node_that_is_not_quarantined_changes_nothing(tmp_path):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path)
    held(tmp_path, cfg, record=None)
    code, out = agent.operator_readmit(cfg, 200, inputs(addresses=()))
    assert (code, json.loads(out)["verdict"]) == (0, "not quarantined")
    assert state_of(cfg) == {"record": None, "kmsg_seq": 800} and calls(tmp_path) == []


def test_readmit_says_when_ray_does_not_start(tmp_path):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path)
    cfg["systemctl"] = recorder(tmp_path, "failing-systemctl", rc=5)
    held(tmp_path, cfg, record=dict(HARDWARE_RECORD, **{"class": "transient", "check": "fabric_link"}))
    code, out = agent.operator_readmit(cfg, 200, inputs())
    assert (code, json.loads(out)["ray_started"]) == (1, False)
    assert state_of(cfg)["record"] is None


def test_an_operator_readmission_of_a_stopped_cluster_clears_the_record_and_leaves_ray_stopped(tmp_path):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path, gpus=["0000:00:06.0"])
    (tmp_path / "unit.enabled").write_text("disabled\n")
    held(tmp_path, cfg)
    code, out = agent.operator_readmit(cfg, 200, dict(inputs(), driver_gpus=lambda: ["0000:00:06.0"]))
    result = json.loads(out)
    assert (code, result["verdict"], result["ray_started"]) == (0, "admitted", False)
    assert result["ray_note"].startswith("Ray not started: its unit ray-worker.service is disabled")
    assert state_of(cfg)["record"] is None and calls(tmp_path) == []


def test_the_readmit_command_line_prints_one_json_object_and_exits_3_when_refused(tmp_path, capsys, monkeypatch):
    agent = load_agent(tmp_path)
    cfg = config(tmp_path)
    held(tmp_path, cfg, record=dict(HARDWARE_RECORD, **{"class": "transient", "check": "fabric_link"}))
    (tmp_path / "health.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(agent, "readers", lambda config: inputs(addresses=()))
    assert agent.main(["--config", str(tmp_path / "health.json"), "--readmit"]) == 3
    result = json.loads(capsys.readouterr().out)
    assert result["verdict"] == "refused" and result["findings"][0]["check"] == "fabric_address"


# The circuit breaker: the agent runs raymetal_health_breaker.py with Ray's venv Python, which keeps the
# quarantine slots in the GCS's key-value store. Here the helper runs for real, with a stand-in for Ray's GCS
# client: a key-value store in a JSON file with the GCS's semantics (a put without overwrite adds a key only
# when it is absent, and says how many it added).
FAKE_GCS = '''
import json, os, sys, types

class GcsClient:
    def __init__(self, address):
        if address == "unreachable:6379":
            raise RuntimeError("Failed to connect to GCS at unreachable:6379")
        self.path = os.environ["FAKE_KV"]

    def _load(self):
        return json.load(open(self.path)) if os.path.exists(self.path) else {}

    def _save(self, kv):
        json.dump(kv, open(self.path, "w"))

    def internal_kv_put(self, key, value, overwrite, namespace):
        kv, name = self._load(), (namespace + b"/" + key).decode()
        if name in kv and not overwrite:
            return 0
        added = name not in kv
        kv[name] = value.decode()
        self._save(kv)
        return int(added)

    def internal_kv_get(self, key, namespace):
        value = self._load().get((namespace + b"/" + key).decode())
        return None if value is None else value.encode()

    def internal_kv_del(self, key, del_by_prefix, namespace):
        kv = self._load()
        found = kv.pop((namespace + b"/" + key).decode(), None)
        self._save(kv)
        return int(found is not None)

ray = types.ModuleType("ray"); raylet = types.ModuleType("ray._raylet"); raylet.GcsClient = GcsClient
sys.modules.update({"ray": ray, "ray._raylet": raylet})
sys.path.insert(0, os.environ["BREAKER_DIR"])
import raymetal_health_breaker
sys.exit(raymetal_health_breaker.main())
'''


def breaker_config(tmp_path, host, limit=1, window_s=0, gcs="10.10.0.1:6379"):
    """A worker's loop with the breaker on; every worker of one test shares the fake GCS (kv.json)."""
    wrapper = tmp_path / "fake_gcs_breaker.py"
    wrapper.write_text(FAKE_GCS)
    node = tmp_path / host
    node.mkdir(exist_ok=True)
    cfg = config(node, host=host, temp_dir=str(node), min_free_bytes=2 ** 62)
    cfg["breaker"] = {"python": sys.executable, "script": str(wrapper), "gcs": gcs, "limit": limit,
                      "window_s": window_s, "token_path": "/etc/ray/auth_token", "timeout_s": 30,
                      "env": {"FAKE_KV": str(tmp_path / "kv.json"),
                              "BREAKER_DIR": str(ROOT / "roles" / "health" / "files")}}
    return cfg


def kv(tmp_path):
    path = tmp_path / "kv.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_the_breaker_lets_one_worker_be_quarantined_and_keeps_the_second_running(tmp_path, capsys):
    agent = load_agent(tmp_path)
    w1, w2 = breaker_config(tmp_path, "w1"), breaker_config(tmp_path, "w2")
    assert agent.one_round(w1, 100, inputs())[2] == "quarantine"
    assert json.loads(kv(tmp_path)["raymetal/raymetal/health/quarantine/0"])["host"] == "w1"
    state, _, action = agent.one_round(w2, 101, inputs())
    # The second FAIL: no slot left, so no drain and no stop on w2; the round says why and the metric is 1.
    assert action == "breaker" and state["record"] is None
    assert [c for c in calls(tmp_path / "w2")] == []
    assert state["breaker"]["why"] == "1 of 1 quarantine slots held (w1)" and state["breaker"]["check"] == "temp_dir"
    out = capsys.readouterr().out
    assert "w2 not quarantined, the circuit breaker is open: 1 of 1 quarantine slots held (w1)" in out
    prom = (tmp_path / "w2" / "textfile" / "raymetal_health.prom").read_text()
    assert 'raymetal_health_breaker_open{check="temp_dir"} 1' in prom
    assert 'raymetal_health_quarantined{class="",check=""} 0' in prom
    # Still failing: asked again each round, still refused (its first refusal time kept).
    state, _, action = agent.one_round(w2, 110, inputs())
    assert action == "breaker" and state["breaker"]["since"] == 101
    # w1 repaired and re-admitted (2 passing rounds): its slot is released (window 0: at once) ...
    w1.update(min_free_bytes=0)
    agent.one_round(w1, 120, inputs())
    assert agent.one_round(w1, 130, inputs())[2] == "readmit"
    assert kv(tmp_path) == {}
    # ... and w2's next round takes it.
    state, _, action = agent.one_round(w2, 140, inputs())
    assert action == "quarantine" and state["breaker_slot"] == 0 and "breaker" not in state
    assert calls(tmp_path / "w2")[-1] == "systemctl stop ray-worker.service"
    assert 'raymetal_health_breaker_open{check=""} 0' in (tmp_path / "w2" / "textfile" / "raymetal_health.prom").read_text()


def test_a_fault_that_goes_while_the_breaker_held_it_back_clears_the_breaker(tmp_path, capsys):
    agent = load_agent(tmp_path)
    w1, w2 = breaker_config(tmp_path, "w1"), breaker_config(tmp_path, "w2")
    agent.one_round(w1, 100, inputs())
    assert agent.one_round(w2, 101, inputs())[2] == "breaker"
    w2.update(min_free_bytes=0)
    state, _, action = agent.one_round(w2, 110, inputs())
    assert action is None and "breaker" not in state and state["record"] is None
    assert "w2: the fault the circuit breaker held back is gone" in capsys.readouterr().out


def test_a_released_slot_stays_held_for_the_window(tmp_path):
    agent = load_agent(tmp_path)
    w1, w2 = breaker_config(tmp_path, "w1", window_s=600), breaker_config(tmp_path, "w2", window_s=600)
    agent.one_round(w1, 100, inputs())
    w1.update(min_free_bytes=0)
    agent.one_round(w1, 110, inputs())
    state, _, action = agent.one_round(w1, 120, inputs())
    assert action == "readmit"
    # Released but held: a second fault within the window is refused, the slot says when it was released.
    assert state["breaker_free_at"] >= 120
    slot = json.loads(kv(tmp_path)["raymetal/raymetal/health/quarantine/0"])
    assert slot["host"] == "w1" and slot["released_at"] >= 120
    assert agent.one_round(w2, 130, inputs())[2] == "breaker"
    # w1's own loop frees it once the window has passed; then w2 gets it.
    agent.one_round(w1, state["breaker_free_at"] + 1, inputs())
    assert kv(tmp_path) == {}
    assert agent.one_round(w2, state["breaker_free_at"] + 2, inputs())[2] == "quarantine"


def test_a_breaker_that_cannot_reach_the_gcs_quarantines_nothing(tmp_path, capsys):
    agent = load_agent(tmp_path)
    cfg = breaker_config(tmp_path, "w1", gcs="unreachable:6379")
    state, _, action = agent.one_round(cfg, 100, inputs())
    assert action == "breaker" and state["record"] is None and calls(tmp_path / "w1") == []
    assert state["breaker"]["why"].startswith("the breaker could not be asked (RuntimeError: Failed to connect")


def test_a_fabric_fault_takes_no_slot(tmp_path):
    """Off the fabric the node is out of the cluster whatever the loop does, and cannot reach the GCS."""
    agent = load_agent(tmp_path)
    cfg = breaker_config(tmp_path, "w1", gcs="unreachable:6379")
    cfg.update(min_free_bytes=0)
    state, _, action = agent.one_round(cfg, 100, inputs(addresses=()))
    assert action == "quarantine" and "breaker_slot" not in state and kv(tmp_path) == {}


def test_an_operator_readmission_releases_the_slot(tmp_path):
    agent = load_agent(tmp_path)
    w1 = breaker_config(tmp_path, "w1")
    agent.one_round(w1, 100, inputs())
    assert kv(tmp_path)
    w1.update(min_free_bytes=0)
    code, _ = agent.operator_readmit(w1, 110, inputs())
    assert code == 0 and kv(tmp_path) == {}
    assert "breaker_slot" not in state_of(w1)


def test_a_worker_quarantined_again_within_its_window_keeps_its_place(tmp_path):
    agent = load_agent(tmp_path)
    w1 = breaker_config(tmp_path, "w1", window_s=600)
    agent.one_round(w1, 100, inputs())
    w1.update(min_free_bytes=0)
    agent.one_round(w1, 110, inputs())
    assert agent.one_round(w1, 120, inputs())[2] == "readmit"
    w1.update(min_free_bytes=2 ** 62)
    state, _, action = agent.one_round(w1, 130, inputs())
    assert action == "quarantine" and "breaker_free_at" not in state
    assert "released_at" not in json.loads(kv(tmp_path)["raymetal/raymetal/health/quarantine/0"])
    # Its loop's later rounds, past the old window, do not free the place it holds again.
    agent.one_round(w1, 900, inputs())
    assert json.loads(kv(tmp_path)["raymetal/raymetal/health/quarantine/0"])["host"] == "w1"


def test_a_release_that_did_not_get_through_is_done_by_a_later_round(tmp_path):
    agent = load_agent(tmp_path)
    w1 = breaker_config(tmp_path, "w1")
    agent.one_round(w1, 100, inputs())
    w1.update(min_free_bytes=0)
    agent.one_round(w1, 110, inputs())
    reachable = w1["breaker"]["gcs"]
    w1["breaker"]["gcs"] = "unreachable:6379"
    state, _, action = agent.one_round(w1, 120, inputs())
    assert action == "readmit" and kv(tmp_path) and state["breaker_free_at"] == 120
    w1["breaker"]["gcs"] = reachable
    state, _, _ = agent.one_round(w1, 130, inputs())
    assert kv(tmp_path) == {} and "breaker_free_at" not in state


def test_a_node_that_leaves_the_cluster_frees_its_place_at_once(tmp_path):
    """remove-node (--leave): a quarantined worker's place, and a re-admitted one's held for its window, are
    deleted at once, so that the next worker's fault is quarantined; a GCS out of reach is an error, not a
    silent success, for a node that holds a place."""
    agent = load_agent(tmp_path)
    w1, w2 = breaker_config(tmp_path, "w1", window_s=600), breaker_config(tmp_path, "w2", window_s=600)
    agent.one_round(w1, 100, inputs())
    assert agent.one_round(w2, 101, inputs())[2] == "breaker"
    reachable = w1["breaker"]["gcs"]
    w1["breaker"]["gcs"] = "unreachable:6379"
    code, out = agent.leave(w1, 105)
    assert code == 1 and json.loads(out)["error"].startswith("RuntimeError: Failed to connect") and kv(tmp_path)
    w1["breaker"]["gcs"] = reachable
    code, out = agent.leave(w1, 110)
    assert (code, json.loads(out)) == (0, {"released": True, "held": True, "slot": 0})
    assert kv(tmp_path) == {} and "breaker_slot" not in state_of(w1)
    assert agent.one_round(w2, 120, inputs())[2] == "quarantine"
    # A re-admitted worker's place, still held for its window, goes at once too; one that holds none: held false.
    w2.update(min_free_bytes=0)
    agent.one_round(w2, 130, inputs())
    assert agent.one_round(w2, 140, inputs())[2] == "readmit" and kv(tmp_path)
    assert json.loads(agent.leave(w2, 150)[1]) == {"released": True, "held": True, "slot": None}
    assert kv(tmp_path) == {} and "breaker_free_at" not in state_of(w2)
    # One that holds none asks nothing of the GCS: a removed node, firewalled out of it, leaves again (the rerun).
    w1["breaker"]["gcs"] = "unreachable:6379"
    code, out = agent.leave(w1, 160)
    assert (code, json.loads(out)) == (0, {"released": False, "held": False, "slot": None,
                                           "why": "this node holds no place in the circuit breaker"})
