"""roles/ray/files/ray_node_drain.py against a stand-in state API on loopback and a stand-in `ray` CLI."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
SCRIPT = ROOT / "roles" / "ray" / "files" / "ray_node_drain.py"
TOKEN = "f" * 64
NODE = "a" * 56


class StateApi(http.server.BaseHTTPRequestHandler):
    """Answers /api/v0/{nodes,tasks,actors} from the server's `state` dict; counts the polls."""

    def log_message(self, *args):
        pass

    def do_GET(self):  # noqa: N802 (http.server's name)
        state = self.server.state
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            self.send_response(401)
            self.end_headers()
            return
        url = urllib.parse.urlparse(self.path)
        kind = url.path.rsplit("/", 1)[-1]
        query = urllib.parse.parse_qs(url.query)
        if kind == "nodes":
            rows = state["nodes"]
        else:
            state["polls"] += 1
            if state["polls"] >= state.get("leave_after", 10 ** 9):
                # An idle draining raylet exits: the GCS marks the node DEAD.
                state["nodes"] = [dict(state["nodes"][0], state="DEAD")] + state["nodes"][1:]
            if state["polls"] > state["busy_polls"]:
                rows = []
            else:
                rows = state[kind]
            assert query["filter_keys"] == ["node_id", "state"], query
            assert query["filter_values"][0] == NODE, query
        body = json.dumps({"result": True, "data": {"result": {"result": rows}}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StateApi)
    server.state = {
        "nodes": [{"node_id": NODE, "node_ip": "10.0.0.12", "state": "ALIVE", "is_head_node": False},
                  {"node_id": "b" * 56, "node_ip": "10.0.0.10", "state": "ALIVE", "is_head_node": True}],
        "tasks": [{"task_id": "t" * 40, "name": "Holder.hold", "type": "ACTOR_TASK", "state": "RUNNING"}],
        "actors": [{"actor_id": "c" * 32, "class_name": "Holder", "pid": 4242, "state": "ALIVE"}],
        "polls": 0,
        "busy_polls": 0,
    }
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def run(tmp_path, server, ip, deadline=5, ray_rc=0):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    record = tmp_path / "ray-args"
    ray = tmp_path / "ray"
    ray.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$RAY_AUTH_MODE $RAY_AUTH_TOKEN_PATH\" \"$@\" > {record}\n"
                   f"echo 'drain refused' >&2\nexit {ray_rc}\n")
    ray.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "http://127.0.0.1:%d" % server.server_address[1], "10.0.0.10:6379", ip,
         str(token), str(deadline), str(ray), "maintenance", "0.05"],
        capture_output=True, text=True, timeout=60, env=env, check=False)
    assert TOKEN not in proc.stdout + proc.stderr
    args = record.read_text().splitlines() if record.exists() else []
    return proc.returncode, json.loads(proc.stdout), args


def test_an_ip_without_an_alive_node_has_nothing_to_drain(tmp_path, api):
    rc, out, args = run(tmp_path, api, "10.0.0.99")
    assert rc == 0 and out["drained"] is False and out["node_state"] == "not an alive node"
    assert args == []


def test_the_head_is_refused(tmp_path, api):
    rc, out, args = run(tmp_path, api, "10.0.0.10")
    assert rc == 2 and "head" in out["error"] and args == []


def test_drains_through_the_cli_with_the_token_file_and_waits_until_the_work_is_gone(tmp_path, api):
    api.state["busy_polls"] = 4
    rc, out, args = run(tmp_path, api, "10.0.0.12")
    assert rc == 0, out
    assert out["drained"] and out["idle"] and out["still_running"] == [] and out["node_id"] == NODE
    assert args[0] == "token " + str(tmp_path / "token")
    assert args[1:] == ["drain-node", "--address", "10.0.0.10:6379", "--node-id", NODE,
                        "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "maintenance",
                        "--deadline-remaining-seconds", "5"]
    assert api.state["polls"] > 4


def test_at_the_deadline_it_lists_what_still_runs(tmp_path, api):
    api.state["busy_polls"] = 10 ** 6
    rc, out, _ = run(tmp_path, api, "10.0.0.12", deadline=1)
    assert rc == 0 and out["drained"] and not out["idle"]
    assert out["seconds"] >= 1
    assert out["still_running"] == ["actor Holder cccccccccccc (pid 4242)", "task Holder.hold tttttttttttt (ACTOR_TASK)"]


def test_a_node_that_leaves_the_cluster_is_drained(tmp_path, api):
    api.state["busy_polls"] = 10 ** 6
    api.state["leave_after"] = 3
    rc, out, _ = run(tmp_path, api, "10.0.0.12", deadline=30)
    assert rc == 0 and out["idle"] and out["node_state"] == "DEAD" and out["seconds"] < 30, out


def test_a_refused_drain_fails_with_the_cli_message(tmp_path, api):
    rc, out, _ = run(tmp_path, api, "10.0.0.12", ray_rc=1)
    assert rc == 1 and "drain refused" in out["error"] and not out["drained"]


# gcs-only: the health loop drains the worker it runs on without the dashboard's HTTP (which would carry the token
# across the fabric in clear): the node is found and watched through the GCS, the work read from this node's processes.
def load_helper():
    import importlib.util  # pylint: disable=import-outside-toplevel

    spec = importlib.util.spec_from_file_location("ray_node_drain", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def proc_tree(tmp_path, titles):
    root = tmp_path / "proc"
    for pid, title in titles.items():
        (root / str(pid)).mkdir(parents=True)
        # setproctitle writes the title over argv: the rest of the area is NUL padding.
        (root / str(pid) / "cmdline").write_bytes(title.encode() + b"\0" * 8)
    (root / "self").mkdir(parents=True, exist_ok=True)
    return root


class GcsStandIn:
    """The GCS's node list, as GcsNodes returns it; busy until `work_polls` lists were asked for, DEAD after `leave`."""

    def __init__(self, leave_after=10 ** 9):
        self.calls = 0
        self.leave_after = leave_after

    def __call__(self):
        self.calls += 1
        state = "DEAD" if self.calls > self.leave_after else "ALIVE"
        return [{"node_id": NODE, "node_ip": "10.0.0.12", "state": state, "is_head_node": False},
                {"node_id": "b" * 56, "node_ip": "10.0.0.10", "state": "ALIVE", "is_head_node": True}]


def run_gcs_only(tmp_path, monkeypatch, capsys, proc, gcs, ip="10.0.0.12", deadline=5):
    helper = load_helper()

    def no_http(*args, **kwargs):
        raise AssertionError("gcs-only asked the dashboard over HTTP")

    monkeypatch.setattr(helper.urllib.request, "urlopen", no_http)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    record = tmp_path / "ray-args"
    ray = tmp_path / "ray"
    ray.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\n")
    ray.chmod(0o755)
    rc = helper.main(["ray-node-drain", "gcs-only", "10.0.0.10:6379", ip, str(token), str(deadline), str(ray),
                      "raymetal health: gpu_xid", "0.05"], proc_root=str(proc), gcs_nodes=gcs)
    out = capsys.readouterr().out
    assert TOKEN not in out
    return rc, json.loads(out), record.read_text().splitlines() if record.exists() else []


def test_gcs_only_drains_this_node_and_waits_for_its_own_processes(tmp_path, monkeypatch, capsys):
    proc = proc_tree(tmp_path, {101: "ray::IDLE", 102: "ray::DashboardAgent", 103: "ray::RuntimeEnvAgent",
                                104: "ray::Trainer.fit", 105: "/opt/ray/venv/bin/python -m ray.raylet"})
    gcs = GcsStandIn()
    done = []

    def finish_after_three_polls():
        if gcs.calls >= 3 and not done:
            (proc / "104" / "cmdline").write_bytes(b"ray::IDLE\0")
            done.append(True)
        return GcsStandIn.__call__(gcs)

    rc, out, args = run_gcs_only(tmp_path, monkeypatch, capsys, proc, finish_after_three_polls)
    assert rc == 0, out
    assert out["drained"] and out["idle"] and out["node_id"] == NODE and out["still_running"] == []
    assert args[:5] == ["drain-node", "--address", "10.0.0.10:6379", "--node-id", NODE]
    assert done, "it stopped waiting while ray::Trainer.fit still ran"


def test_gcs_only_lists_this_node_s_work_at_the_deadline(tmp_path, monkeypatch, capsys):
    proc = proc_tree(tmp_path, {7: "ray::IDLE_SpillWorker", 8: "ray::Holder", 9: "ray::train_step"})
    rc, out, _ = run_gcs_only(tmp_path, monkeypatch, capsys, proc, GcsStandIn(), deadline=1)
    assert rc == 0 and out["drained"] and not out["idle"]
    assert out["still_running"] == ["ray::Holder (pid 8)", "ray::train_step (pid 9)"]


def test_gcs_only_a_node_that_leaves_the_cluster_is_drained(tmp_path, monkeypatch, capsys):
    proc = proc_tree(tmp_path, {9: "ray::train_step"})
    rc, out, _ = run_gcs_only(tmp_path, monkeypatch, capsys, proc, GcsStandIn(leave_after=3), deadline=30)
    assert rc == 0 and out["idle"] and out["node_state"] == "DEAD" and out["seconds"] < 30, out


def test_gcs_only_refuses_the_head_and_skips_a_node_the_gcs_does_not_list_alive(tmp_path, monkeypatch, capsys):
    proc = proc_tree(tmp_path, {})
    rc, out, args = run_gcs_only(tmp_path, monkeypatch, capsys, proc, GcsStandIn(), ip="10.0.0.10")
    assert rc == 2 and "head" in out["error"] and args == []
    rc, out, args = run_gcs_only(tmp_path, monkeypatch, capsys, proc, GcsStandIn(), ip="10.0.0.99")
    assert rc == 0 and out["node_state"] == "not an alive node" and args == []


def test_the_ray_role_hands_the_health_loop_the_gcs_only_drain():
    configure = (ROOT / "roles" / "ray" / "tasks" / "configure.yml").read_text()
    helper = configure.split("ray_drain_helper:")[1].split("\n- name:")[0]
    assert "dashboard_url: gcs-only" in helper and "http" not in helper.replace("# ", "").split("dashboard_url")[1][:40]
