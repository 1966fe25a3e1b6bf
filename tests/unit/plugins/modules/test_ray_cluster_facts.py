"""Unit tests for plugins/modules/ray_cluster_facts.py.

A stdlib http.server on 127.0.0.1 (random port, in a thread) replays responses
recorded from a real Ray 2.60 cluster (tests/fixtures/ray_api/, made by
tests/fixtures/record_ray_api.py): a head with 2 CPUs and 2 GPUs alone
(head_only), joined by a second node while an actor holds 1 CPU and 1 GPU
(two_alive), and after that node was killed (one_dead), plus Ray's own 401
and 403 answers. Like Ray, the replay server answers 401 without a token and
403 with a wrong one; /api/gcs_healthz needs none.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
from pathlib import Path
from unittest import mock

import pytest

from module_harness import ExitJson, FailJson
from module_harness import run_module as harness_run

from ansible_collections.raymetal.cluster.plugins.modules import ray_cluster_facts as rcf
from ansible_collections.raymetal.cluster.plugins.filter import ray_cluster as rcfilter

REPO = Path(__file__).resolve().parents[4]
FIXTURES = REPO / "tests" / "fixtures" / "ray_api"
TOKEN = "f" * 64
HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"
EXPECTED = {"raymetal-head": HEAD_IP, "raymetal-worker1": WORKER_IP}


def load(scenario, name):
    return json.loads((FIXTURES / scenario / (name + ".json")).read_text())


class ReplayServer:
    """Serve recordings; `scenarios` is consumed one per nodes request, the last one sticks."""

    def __init__(self, scenarios):
        self.scenarios = list(scenarios)
        self.override = {}  # path -> (status, body): answers that replace the recordings
        self.requests = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Authorization")))
                status, ctype, body = server.answer(self.path, self.headers.get("Authorization"))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def answer(self, path, auth):
        if path in self.override:
            status, body = self.override[path]
            return status, "application/json", body
        if path != "/api/gcs_healthz":
            if auth is None:
                rec = load("auth", "no_token")
                return rec["status"], rec["content_type"], rec["body"]
            if auth != "Bearer " + TOKEN:
                rec = load("auth", "wrong_token")
                return rec["status"], rec["content_type"], rec["body"]
        name = {"/api/version": "version", "/api/gcs_healthz": "gcs_healthz",
                "/api/v0/nodes?detail=true": "nodes", "/api/cluster_status": "cluster_status"}.get(path)
        if name is None:
            return 404, "text/plain", "404: Not Found"
        scenario = self.scenarios[0]
        if name == "nodes" and len(self.scenarios) > 1:
            self.scenarios.pop(0)
        rec = load(scenario, name)
        assert rec["path"] == path
        return rec["status"], rec["content_type"], rec["body"]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "auth_token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return str(path)


def params(server_url, token_path, **extra):
    base = {"address": server_url, "config_path": "/nonexistent/cluster.json", "token_path": token_path,
            "wait_for_nodes": 0, "expected_nodes": {}, "timeout": 5, "validate_certs": True}
    base.update(extra)
    return base


class FakeClock:
    """Monotonic clock that advances only when the module sleeps."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def gather(p, clock=None):
    clock = clock or FakeClock()
    return rcf.gather(p, sleep=clock.sleep, clock=clock)


# --- facts from recorded answers -------------------------------------------------------------


def test_two_alive_nodes_with_gpu_head(token_file):
    with ReplayServer(["two_alive"]) as srv:
        facts = gather(params(srv.url, token_file, expected_nodes=EXPECTED))
    assert facts["ray_version"] == "2.60.0"
    assert facts["healthy"] is True
    assert (facts["nodes_alive"], facts["nodes_dead"]) == (2, 0)
    assert facts["missing"] == []
    assert facts["totals"]["CPU"] == 3.0
    assert facts["totals"]["GPU"] == 2.0
    assert facts["totals"]["fabric_ib"] == 1.0
    assert facts["totals"]["object_store_memory"] == 256 * 2**20 + 128 * 2**20
    assert not any(k.startswith("node:") for k in facts["totals"])
    # the holder actor takes 1 CPU and 1 GPU on the head; camel-cased names map back
    assert facts["available"]["CPU"] == 2.0
    assert facts["available"]["GPU"] == 1.0
    assert facts["available"]["fabric_ib"] == 1.0
    head, worker = facts["nodes"]
    assert (head["hostname"], head["ip"], head["is_head"], head["state"]) == ("raymetal-head", HEAD_IP, True, "ALIVE")
    assert head["resources"]["GPU"] == 2.0 and head["available"]["GPU"] == 1.0
    assert (worker["hostname"], worker["ip"], worker["is_head"]) == ("raymetal-worker1", WORKER_IP, False)
    assert worker["labels"]["rack"] == "r2"
    assert len(worker["node_id"]) == 56
    # every API call but the health check carries the token
    assert all(auth == "Bearer " + TOKEN for _, auth in srv.requests)
    assert {p for p, _ in srv.requests} == {"/api/version", "/api/gcs_healthz",
                                             "/api/v0/nodes?detail=true", "/api/cluster_status"}


def test_dead_node_counted_apart_and_named_missing(token_file):
    with ReplayServer(["one_dead"]) as srv:
        facts = gather(params(srv.url, token_file, expected_nodes=EXPECTED))
    assert (facts["nodes_alive"], facts["nodes_dead"]) == (1, 1)
    assert facts["missing"] == ["raymetal-worker1"]
    assert facts["totals"]["CPU"] == 2.0  # DEAD node's resources left out
    dead = facts["nodes"][-1]
    assert dead["state"] == "DEAD" and dead["available"] == {}
    assert "SIGTERM" in dead["state_message"]


def test_autoscaler_not_reported_yet_counts_nodes_idle(token_file):
    with ReplayServer(["head_only"]) as srv:
        facts = gather(params(srv.url, token_file))
    assert facts["nodes_alive"] == 1
    assert facts["available"] == facts["totals"]
    assert facts["nodes"][0]["hostname"] == HEAD_IP  # no expected_nodes: Ray's node name


def test_wait_for_nodes_polls_until_enough_alive(token_file):
    clock = FakeClock()
    with ReplayServer(["head_only", "head_only", "two_alive"]) as srv:
        facts = gather(params(srv.url, token_file, wait_for_nodes=2, timeout=30), clock)
    assert facts["nodes_alive"] == 2
    assert len(clock.sleeps) == 2
    assert sum(1 for p, _ in srv.requests if p.startswith("/api/v0/nodes")) == 3


def test_wait_for_nodes_timeout_names_missing_hosts(token_file):
    expected = dict(EXPECTED, **{"raymetal-worker2": "127.0.0.4"})
    with ReplayServer(["one_dead"]) as srv:
        with pytest.raises(rcf.RayFactsError) as err:
            gather(params(srv.url, token_file, wait_for_nodes=3, timeout=10, expected_nodes=expected))
    msg = str(err.value)
    assert "timed out after 10 s waiting for 3 ALIVE Ray nodes; 1 alive (127.0.0.2)" in msg
    assert "raymetal-worker1 (127.0.0.3), raymetal-worker2 (127.0.0.4)" in msg
    assert "raymetal-head" not in msg
    assert "DEAD in the GCS: 127.0.0.3" in msg
    assert "journalctl -u ray-worker -n 50" in msg


# --- errors: one clear message each -----------------------------------------------------------


def test_wrong_token_is_403_message(tmp_path):
    bad = tmp_path / "tok"
    bad.write_text("0" * 64)
    with ReplayServer(["two_alive"]) as srv:
        with pytest.raises(rcf.RayFactsError) as err:
            gather(params(srv.url, str(bad)))
    assert "403 Forbidden (Forbidden: Invalid authentication token)" in str(err.value)
    assert "not the cluster's token" in str(err.value)


def test_requests_go_through_open_url_with_the_token_and_tls_setting(token_file):
    # The module has no HTTP client of its own: every request is ansible's open_url.
    real_open_url = rcf.open_url
    with ReplayServer(["two_alive"]) as srv, \
            mock.patch.object(rcf, "open_url", side_effect=real_open_url) as spy:
        facts = gather(params(srv.url, token_file, validate_certs=False))
    assert facts["nodes_alive"] == 2
    assert spy.call_count >= 3
    for call in spy.call_args_list:
        assert call.kwargs["headers"]["Authorization"] == "Bearer " + TOKEN
        assert call.kwargs["validate_certs"] is False


def test_tls_failure_is_one_message_not_a_traceback(token_file):
    # https:// to a plain-HTTP listener: the TLS handshake fails inside open_url.
    with ReplayServer(["two_alive"]) as srv:
        with pytest.raises(rcf.RayFactsError) as err:
            gather(params(srv.url.replace("http://", "https://"), token_file))
    assert "cannot reach https://" in str(err.value)


def test_401_message_names_auth_mode(token_file):
    rec = load("auth", "no_token")
    with ReplayServer(["two_alive"]) as srv:
        srv.override["/api/version"] = (rec["status"], rec["body"])
        with pytest.raises(rcf.RayFactsError) as err:
            gather(params(srv.url, token_file))
    assert "401 Unauthorized (Unauthorized: Missing authentication token)" in str(err.value)
    assert "RAY_AUTH_MODE=token" in str(err.value)


class RefusingApi(object):
    """Raises NotListening for the first `refusals` version requests, then answers like `real`."""

    def __init__(self, real, refusals):
        self.real = real
        self.refusals = refusals
        self.address = real.address

    def get_json(self, path):
        if path == rcf.PATH_VERSION and self.refusals > 0:
            self.refusals -= 1
            raise rcf.NotListening("connection refused at %s%s: ray-head.service" % (self.address, path))
        return self.real.get_json(path)

    def get(self, path):
        return self.real.get(path)


def refusing(refusals):
    """An api_factory whose client is refused `refusals` times before the dashboard listens."""
    return lambda *args: RefusingApi(rcf.RayApi(*args), refusals)


def test_wait_retries_a_dashboard_that_is_not_listening_yet(token_file):
    clock = FakeClock()
    with ReplayServer(["two_alive"]) as srv:
        factory = refusing(3)
        facts = rcf.gather(params(srv.url, token_file, wait_for_nodes=2, timeout=30),
                           api_factory=factory, sleep=clock.sleep, clock=clock)
    assert facts["nodes_alive"] == 2
    assert clock.sleeps == [1.0, 1.0, 1.0]


def test_wait_gives_up_on_a_dashboard_that_never_listens(token_file):
    clock = FakeClock()
    with ReplayServer(["two_alive"]) as srv:
        factory = refusing(1000)
        with pytest.raises(rcf.RayFactsError) as err:
            rcf.gather(params(srv.url, token_file, wait_for_nodes=2, timeout=5),
                       api_factory=factory, sleep=clock.sleep, clock=clock)
    assert "connection refused" in str(err.value) and "(waited 5 s)" in str(err.value)
    assert len(clock.sleeps) == 5


def test_without_wait_a_refused_connection_fails_at_once(token_file):
    clock = FakeClock()
    with ReplayServer(["two_alive"]) as srv:
        factory = refusing(1)
        with pytest.raises(rcf.RayFactsError) as err:
            rcf.gather(params(srv.url, token_file), api_factory=factory, sleep=clock.sleep, clock=clock)
    assert "waited" not in str(err.value) and clock.sleeps == []


class DroppingApi(RefusingApi):
    """Drops the first `refusals` node-list requests the way a restarting dashboard does."""

    def get_json(self, path):
        if path == rcf.PATH_NODES and self.refusals > 0:
            self.refusals -= 1
            raise rcf.NotListening("%s%s closed the connection without an answer" % (self.address, path))
        return self.real.get_json(path)


def test_wait_retries_a_node_list_request_that_the_dashboard_dropped(token_file):
    clock = FakeClock()
    with ReplayServer(["two_alive"]) as srv:
        facts = rcf.gather(params(srv.url, token_file, wait_for_nodes=2, timeout=30),
                           api_factory=lambda *args: DroppingApi(rcf.RayApi(*args), 2),
                           sleep=clock.sleep, clock=clock)
    assert facts["nodes_alive"] == 2 and len(clock.sleeps) == 2


def test_a_connection_closed_without_an_answer_is_named(token_file):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]

        def drop():
            for _ in range(2):
                conn, _ = server.accept()
                conn.recv(65536)
                conn.close()

        thread = threading.Thread(target=drop, daemon=True)
        thread.start()
        api = rcf.RayApi("http://127.0.0.1:%d" % port, "t" * 64, 5)
        with pytest.raises(rcf.NotListening) as err:
            api.get(rcf.PATH_NODES)
        # Without a wait, the same drop fails the run at once, naming what happened.
        config_facts = params("http://127.0.0.1:%d" % port, token_file)
        with pytest.raises(rcf.RayFactsError) as err2:
            rcf.gather(config_facts)
        thread.join(5)
    assert "closed the connection without an answer" in str(err.value)
    assert "closed the connection without an answer" in str(err2.value) and "waited" not in str(err2.value)


def test_connection_refused_names_head_unit(token_file, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    config = tmp_path / "cluster.json"
    config.write_text(json.dumps({"dashboard_url": "http://127.0.0.1:%d" % port, "token_path": token_file,
                                  "head_unit": "ray-head.service"}))
    with pytest.raises(rcf.RayFactsError) as err:
        gather(params(None, None, config_path=str(config)))
    msg = str(err.value)
    assert msg.startswith("connection refused at http://127.0.0.1:%d/api/version" % port)
    assert "ray-head.service" in msg and "journalctl -u ray-head -n 50" in msg


def test_missing_token_file(tmp_path):
    with pytest.raises(rcf.RayFactsError) as err:
        gather(params("http://127.0.0.1:9", str(tmp_path / "nope")))
    assert "Ray auth token file %s does not exist" % (tmp_path / "nope") in str(err.value)
    assert "owner ray, mode 0600" in str(err.value)


def test_unreadable_token_names_path_owner_mode_uid(token_file, monkeypatch):
    real_open = open

    def deny(path, *args, **kwargs):
        if str(path) == token_file:
            raise PermissionError(13, "Permission denied", token_file)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(rcf, "open", deny, raising=False)
    with pytest.raises(rcf.RayFactsError) as err:
        gather(params("http://127.0.0.1:9", token_file))
    msg = str(err.value)
    assert "cannot read Ray auth token file %s" % token_file in msg
    assert "mode 0600" in msg and "runs as uid %d" % os.geteuid() in msg
    assert "Permission denied" in msg and "become: true" in msg


def test_empty_token_file(tmp_path):
    empty = tmp_path / "tok"
    empty.write_text("\n")
    with pytest.raises(rcf.RayFactsError, match="is empty"):
        gather(params("http://127.0.0.1:9", str(empty)))


def test_non_json_answer_is_shown_truncated(token_file):
    page = "<html>" + "x" * 1000 + "</html>"
    with ReplayServer(["two_alive"]) as srv:
        srv.override["/api/version"] = (200, page)
        with pytest.raises(rcf.RayFactsError) as err:
            gather(params(srv.url, token_file))
    msg = str(err.value)
    assert "/api/version did not answer JSON; received: <html>xxx" in msg
    assert "(1013 chars in all)" in msg and len(msg) < 500


def test_unexpected_json_shape_is_shown(token_file):
    with ReplayServer(["two_alive"]) as srv:
        srv.override["/api/v0/nodes?detail=true"] = (200, json.dumps({"result": False, "msg": "boom"}))
        with pytest.raises(rcf.RayFactsError) as err:
            gather(params(srv.url, token_file))
    assert 'unexpected JSON from /api/v0/nodes?detail=true (no data.result.result list); ' \
           'received: {"msg": "boom", "result": false}' in str(err.value)


def test_no_config_and_no_address(tmp_path):
    with pytest.raises(rcf.RayFactsError, match="does not exist and no address was given"):
        gather(params(None, None, config_path=str(tmp_path / "cluster.json")))


def test_gcs_unhealthy_is_reported_not_fatal(token_file):
    with ReplayServer(["two_alive"]) as srv:
        srv.override["/api/gcs_healthz"] = (503, "GCS is unreachable")
        facts = gather(params(srv.url, token_file))
    assert facts["healthy"] is False and facts["nodes_alive"] == 2


# --- through AnsibleModule ------------------------------------------------------------------------


def run_main(args):
    kind, result = harness_run(rcf, args)
    raise kind(result)


def test_main_returns_facts_from_config_in_check_mode(token_file, tmp_path):
    with ReplayServer(["two_alive"]) as srv:
        config = tmp_path / "cluster.json"
        config.write_text(json.dumps({"dashboard_url": srv.url, "token_path": token_file}))
        with pytest.raises(ExitJson) as res:
            run_main({"config_path": str(config), "expected_nodes": EXPECTED, "_ansible_check_mode": True})
    result = res.value.result
    assert result["changed"] is False
    assert result["ansible_facts"]["ray_cluster"]["nodes_alive"] == 2


def test_main_fails_with_one_message(tmp_path):
    with pytest.raises(FailJson) as res:
        run_main({"address": "http://127.0.0.1:9", "token_path": str(tmp_path / "nope")})
    assert set(res.value.result) == {"msg"}
    assert "does not exist" in res.value.result["msg"]


def test_camel_cased_usage_maps_back_to_ray_resource_names(token_file):
    # The dashboard reports fabric_ib as fabricIb and object_store_memory as objectStoreMemory.
    status = json.loads(load("two_alive", "cluster_status")["body"])
    by_node = status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"]
    head_id = [n for n, u in by_node.items() if "GPU" in u][0]
    by_node[head_id]["fabricIb"] = [1.0, 1.0]
    by_node[head_id]["objectStoreMemory"][0] = float(2**20)
    with ReplayServer(["two_alive"]) as srv:
        srv.override["/api/cluster_status"] = (200, json.dumps(status))
        facts = gather(params(srv.url, token_file))
    head = facts["nodes"][0]
    assert head["available"]["fabric_ib"] == 0.0
    assert head["available"]["object_store_memory"] == 255 * 2**20
    assert "fabricIb" not in facts["available"]


# --- filters: plugins/filter/ray_cluster.py ----------------------------------------------------


def test_summary_table_from_recorded_facts(token_file):
    expected = dict(EXPECTED, **{"raymetal-worker2": "127.0.0.4"})
    with ReplayServer(["one_dead"]) as srv:
        facts = gather(params(srv.url, token_file, expected_nodes=expected))
    lines = rcfilter.ray_summary_table(facts, expected)
    print("\n".join(lines))
    assert lines[0] == "Ray 2.60.0 at %s: GCS healthy, 1 alive, 1 dead" % srv.url
    assert lines[1].split() == ["HOST", "FABRIC", "IP", "STATE", "CPUS", "GPUS", "MEM", "GiB", "OBJ", "GiB"]
    body = {line.split()[0]: line.split() for line in lines[3:]}
    assert body["raymetal-head"][1:5] == ["127.0.0.2", "ALIVE", "(head)", "2"]
    assert body["raymetal-head"][5] == "2"
    assert body["raymetal-head"][7] == "0.2"  # 256 MiB object store
    assert body["raymetal-worker1"][1:3] == ["127.0.0.3", "DEAD"]
    assert body["raymetal-worker2"] == ["raymetal-worker2", "127.0.0.4", "MISSING", "-", "-", "-", "-"]
    assert body["TOTAL"][:5] == ["TOTAL", "(1", "alive)", "2", "2"]
    assert body["AVAILABLE"][1:3] == ["1", "1"]  # the holder actor's CPU and GPU
    assert lines[-1] == "Missing (no ALIVE Ray node at their fabric IP): raymetal-worker1, raymetal-worker2"
    assert not any("earlier" in line for line in lines)
    # fixed width: every column starts at the same offset on every row
    offset = lines[1].index("STATE")
    assert all(line[offset - 2:offset] == "  " for line in lines[3:-1] if not line.startswith("-"))


def test_summary_table_with_empty_facts():
    lines = rcfilter.ray_summary_table({}, {})
    assert lines[0].startswith("Ray ? at ?: GCS NOT healthy, 0 alive")
    assert lines[-1].split()[0] == "AVAILABLE"


def test_fabric_ips_prefers_explicit_then_fabric_fact():
    hostvars = {
        "a": {"ray_node_ip_address": "10.0.0.1", "ansible_facts": {"fabric": {"address": "10.9.9.9"}}},
        "b": {"ansible_facts": {"fabric": {"address": "10.0.0.2"}}},
        "c": {"ray_node_ip_address": "", "ansible_facts": {}},
        "d": {"ray_node_ip_address": "10.0.0.4"},
    }
    assert rcfilter.ray_fabric_ips(["a", "b", "c", "d", "e"], hostvars) == {
        "a": "10.0.0.1", "b": "10.0.0.2", "d": "10.0.0.4"}


# --- a node that came back: one row per host ---------------------------------------------------

def restarted_worker_nodes():
    """The one_dead recording plus the worker back as a new node at the same IP (a restart)."""
    payload = json.loads(load("one_dead", "nodes")["body"])
    nodes = payload["data"]["result"]["result"]
    dead = [n for n in nodes if n["state"] == "DEAD"][0]
    back = dict(dead, node_id="b" * 56, state="ALIVE", state_message="",
                start_time_ms=dead["end_time_ms"] + 5000, end_time_ms=0)
    nodes.append(back)
    return payload, dead, back


def test_a_restarted_node_is_one_row_and_its_old_record_an_earlier_node(token_file):
    payload, dead, back = restarted_worker_nodes()
    with ReplayServer(["one_dead"]) as srv:
        srv.override["/api/v0/nodes?detail=true"] = (200, json.dumps(payload))
        facts = gather(params(srv.url, token_file, expected_nodes=EXPECTED))
    assert [(n["hostname"], n["state"]) for n in facts["nodes"]] == [
        ("raymetal-head", "ALIVE"), ("raymetal-worker1", "ALIVE")]
    assert facts["nodes"][1]["node_id"] == back["node_id"]
    assert (facts["nodes_alive"], facts["nodes_dead"], facts["missing"]) == (2, 0, [])
    assert [(n["hostname"], n["node_id"], n["state"]) for n in facts["earlier_nodes"]] == [
        ("raymetal-worker1", dead["node_id"], "DEAD")]
    assert facts["totals"]["CPU"] == sum(n["resources"]["CPU"] for n in facts["nodes"])

    lines = rcfilter.ray_summary_table(facts, EXPECTED, sorted(EXPECTED))
    print("\n".join(lines))
    assert lines[0].endswith("GCS healthy, 2 alive, 0 dead")
    rows = [line.split()[0] for line in lines[3:] if line.split()[0] in EXPECTED]
    assert rows == ["raymetal-head", "raymetal-worker1"]  # once each
    assert "1 earlier node of raymetal-worker1 is dead (replaced by its current node; Ray keeps the record)" in lines
    assert not any(line.startswith("Missing") for line in lines)


def test_a_node_dead_twice_shows_its_last_record():
    older = {"node_id": "1" * 56, "node_ip": "10.0.0.2", "state": "DEAD", "start_time_ms": 100, "end_time_ms": 200}
    newer = dict(older, node_id="2" * 56, start_time_ms=300, end_time_ms=400)
    current, earlier = rcf.current_and_earlier([newer, older])
    assert current == [newer] and earlier == [older]
    facts = rcf.build_facts("http://x:8265", "2.60.0", True, [older, newer], {}, {"w": "10.0.0.2"})
    assert [n["node_id"] for n in facts["nodes"]] == [newer["node_id"]]
    assert (facts["nodes_dead"], facts["missing"], len(facts["earlier_nodes"])) == (1, ["w"], 1)
    lines = rcfilter.ray_summary_table(facts, {"w": "10.0.0.2"}, ["w"])
    assert "1 earlier node of w is dead (replaced by its current node; Ray keeps the record)" in lines
    assert sum(1 for line in lines if line.startswith("w ")) == 1


def test_hosts_with_no_known_address_are_missing():
    facts = {"nodes_alive": 1, "missing": [], "nodes": [{"ip": "10.0.0.1", "state": "ALIVE", "is_head": True}]}
    lines = rcfilter.ray_summary_table(facts, {"h": "10.0.0.1"}, ["h", "w"])
    assert [line.split()[:3] for line in lines if line.startswith("w ")] == [["w", "?", "MISSING"]]
    assert lines[-1] == "Missing (no ALIVE Ray node at their fabric IP): w"
    assert rcfilter.ray_not_alive(facts, ["h", "w"], {"h": "10.0.0.1"}) == ["w"]
    assert rcfilter.ray_not_alive(dict(facts, missing=["h"]), ["h"], {"h": "10.0.0.1"}) == ["h"]


def test_access_lines_carry_the_inventory_ssh_user_port_key_and_options():
    ssh = {"host": "10.231.10.10", "user": "root", "port": "", "key": "/repo/inventory/lab/../../lab/.state/id_ed25519",
           "common_args": "-o StrictHostKeyChecking=no", "cwd": "/repo",
           "token_file": "/repo/inventory/lab/credentials/ray_auth_token", "token_path": "/etc/ray/auth_token"}
    lines = rcfilter.ray_access_lines({"address": "http://10.231.20.10:8265"}, ssh)
    assert lines[1] == ("  from a workstation: ssh -N -o ExitOnForwardFailure=yes -L 8265:10.231.20.10:8265 "
                        "-i lab/.state/id_ed25519 -o StrictHostKeyChecking=no root@10.231.10.10")
    assert "RAY_AUTH_TOKEN_PATH=inventory/lab/credentials/ray_auth_token" in lines[2]
    assert "--address http://127.0.0.1:8265" in lines[2]
    other = dict(ssh, port=2222, user="", key="~/.ssh/site", common_args="", cwd="/elsewhere")
    tunnel = rcfilter.ray_access_lines({"address": "http://10.0.0.1:8265"}, other)[1]
    assert tunnel.endswith("-L 8265:10.0.0.1:8265 -p 2222 -i %s 10.231.10.10" % os.path.expanduser("~/.ssh/site"))
    assert rcfilter.ray_access_lines({}, ssh) == ["Dashboard and job API: ? (token required)"]


class FailingApi(rcf.RayApi):
    """A dashboard that answers 500 to the first `failures` requests for `path` (what Ray 2.60's state API
    answered, "Server got itself in trouble", while a loaded head's GCS was slow: run32, lab 2's first deploy)."""

    def __init__(self, address, token, timeout, validate_certs=True, head_unit=rcf.DEFAULT_HEAD_UNIT, path=None,
                 failures=0):
        super(FailingApi, self).__init__(address, token, timeout, validate_certs, head_unit)
        self.path, self.failures = path, failures

    def get(self, path):
        if path == self.path and self.failures > 0:
            self.failures -= 1
            return 500, "500 Internal Server Error\n\nServer got itself in trouble"
        return super(FailingApi, self).get(path)


def failing(path, failures):
    return lambda *args: FailingApi(*args, path=path, failures=failures)


@pytest.mark.parametrize("path", [rcf.PATH_VERSION, rcf.PATH_NODES, rcf.PATH_STATUS])
def test_wait_asks_again_a_dashboard_that_answers_500(token_file, path):
    clock = FakeClock()
    with ReplayServer(["two_alive"]) as srv:
        facts = rcf.gather(params(srv.url, token_file, wait_for_nodes=2, timeout=30),
                           api_factory=failing(path, 3), sleep=clock.sleep, clock=clock)
    assert facts["nodes_alive"] == 2 and len(clock.sleeps) == 3


def test_wait_gives_up_on_a_dashboard_that_keeps_answering_500_and_says_so(token_file):
    clock = FakeClock()
    with ReplayServer(["two_alive"]) as srv:
        with pytest.raises(rcf.RayFactsError) as err:
            rcf.gather(params(srv.url, token_file, wait_for_nodes=2, timeout=5),
                       api_factory=failing(rcf.PATH_NODES, 1000), sleep=clock.sleep, clock=clock)
    message = str(err.value)
    assert "/api/v0/nodes?detail=true answered HTTP 500: 500 Internal Server Error" in message, message
    assert "the dashboard is up but failed the request" in message and "(waited 5 s)" in message, message


def test_without_wait_a_500_fails_at_once(token_file):
    clock = FakeClock()
    with ReplayServer(["two_alive"]) as srv:
        with pytest.raises(rcf.RayFactsError) as err:
            rcf.gather(params(srv.url, token_file), api_factory=failing(rcf.PATH_NODES, 1), sleep=clock.sleep,
                       clock=clock)
    assert "answered HTTP 500" in str(err.value) and "waited" not in str(err.value) and clock.sleeps == []
