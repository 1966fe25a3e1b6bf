"""roles/ray/files/ray-node-start: the checks the unit runs before it execs `ray start`."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[4] / "roles" / "ray" / "files" / "ray-node-start"
loader = importlib.machinery.SourceFileLoader("ray_node_start", str(SCRIPT))
spec = importlib.util.spec_from_loader("ray_node_start", loader)
mod = importlib.util.module_from_spec(spec)
loader.exec_module(mod)


@pytest.fixture()
def token(tmp_path):
    path = tmp_path / "auth_token"
    path.write_text("ab" * 32 + "\n")
    return path


def test_ok_when_the_address_is_on_the_interface_and_the_token_readable(token, monkeypatch):
    monkeypatch.setattr(mod, "addresses_of", lambda name: ["10.0.0.5", "10.0.1.5"] if name == "ib0" else None)
    assert mod.check("ib0", "10.0.1.5", str(token)) == (0, "")


def test_a_missing_interface_is_retried_and_named(token, monkeypatch):
    monkeypatch.setattr(mod, "addresses_of", lambda name: None)
    code, msg = mod.check("ib0", "10.0.0.5", str(token))
    assert code == mod.EX_RETRY == 1
    assert "fabric interface ib0 does not exist" in msg and "10.0.0.5" in msg


def test_an_address_on_another_interface_is_retried_and_named(token, monkeypatch):
    monkeypatch.setattr(mod, "addresses_of", lambda name: [])
    code, msg = mod.check("ib0", "10.0.0.5", str(token))
    assert code == 1 and "does not carry 10.0.0.5 (it has: no IPv4 address)" in msg


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file anyway")
def test_an_unreadable_token_is_final(token):
    token.chmod(0)
    code, msg = mod.check("", "10.0.0.5", str(token))
    assert code == mod.EX_CONFIG == 78 and "cannot read the Ray token file" in msg


def test_a_missing_or_empty_token_is_final(tmp_path, token):
    assert mod.check("", "10.0.0.5", str(tmp_path / "missing"))[0] == 78
    token.write_text("\n")
    code, msg = mod.check("", "10.0.0.5", str(token))
    assert code == 78 and "is empty" in msg


def test_the_real_ip_command_reads_loopback():
    assert "127.0.0.1" in mod.addresses_of("lo")
    assert mod.addresses_of("no-such-nic0") is None


def test_it_execs_the_command_only_when_the_checks_pass(tmp_path, token):
    ok = subprocess.run([sys.executable, str(SCRIPT), "lo", "127.0.0.1", str(token), "--", "/bin/echo", "started"],
                        capture_output=True, text=True, check=False)
    assert (ok.returncode, ok.stdout.strip()) == (0, "started")
    refused = subprocess.run([sys.executable, str(SCRIPT), "lo", "192.0.2.1", str(token), "--", "/bin/echo", "started"],
                             capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "raymetal: refusing to start Ray: fabric interface lo does not carry 192.0.2.1" in refused.stderr


def test_no_wait_until_ray_stopped_by_itself_twice_within_the_window():
    now = 10_000.0
    mid = lambda low, high: 1.0  # noqa: E731  # the jitter's middle
    assert mod.backoff([], now, 60, mid) == 0
    assert mod.backoff([now - 5], now, 60, mid) == 0
    assert mod.backoff([now - 30, now - 5], now, 60, mid) == 10
    assert mod.backoff([now - 50, now - 30, now - 5], now, 60, mid) == 20
    assert mod.backoff([now - 70, now - 50, now - 30, now - 5], now, 60, mid) == 40
    assert mod.backoff([now - i for i in range(1, 40)], now, 60, mid) == 60
    # Stops older than the window (or in the future: a clock set back) do not count.
    assert mod.backoff([now - mod.WINDOW - 1, now - 5], now, 60, mid) == 0
    assert mod.backoff([now + 100, now - 5], now, 60, mid) == 0
    # 0 turns the backoff off.
    assert mod.backoff([now - 30, now - 5, now - 1], now, 0, mid) == 0


def test_the_wait_has_jitter_within_a_fifth():
    now = 10_000.0
    waits = {mod.backoff([now - 30, now - 5], now, 60) for _ in range(200)}
    assert min(waits) >= 8 and max(waits) <= 12 and len(waits) > 5


def test_a_deliberate_stop_clears_the_record_and_a_stop_by_itself_adds_to_it(tmp_path):
    record = str(tmp_path / "restarts.json")
    # Ray died (ExecStop, where systemd runs it, has no $MAINPID; older systemd skips it).
    assert mod.record_stop("--stopping", record, 100.0, "") == 0
    mod.record_stop("--stopped", record, 100.0, "")
    mod.record_stop("--stopped", record, 130.0, "")
    assert mod.load(record) == {"stops": [100.0, 130.0], "stopping": False}
    # systemctl stop or restart: ExecStop sees Ray's main process.
    mod.record_stop("--stopping", record, 200.0, "4242")
    assert mod.load(record)["stopping"] is True
    mod.record_stop("--stopped", record, 201.0, "")
    assert mod.load(record) == {"stops": [], "stopping": False}
    # Stops older than the window drop out when the next one is recorded.
    mod.record_stop("--stopped", record, 300.0, "")
    mod.record_stop("--stopped", record, 300.0 + mod.WINDOW + 1, "")
    assert mod.load(record)["stops"] == [300.0 + mod.WINDOW + 1]


def test_a_broken_or_unwritable_record_never_stops_ray(tmp_path):
    record = tmp_path / "restarts.json"
    record.write_text("{not json")
    assert mod.load(str(record)) == {"stops": [], "stopping": False}
    record.write_text('["a list"]')
    assert mod.load(str(record)) == {"stops": [], "stopping": False}
    assert mod.record_stop("--stopped", str(tmp_path / "missing-dir" / "restarts.json"), 1.0, "") == 0


def test_options_before_the_checks_arguments():
    assert mod.options(["--backoff-max=60", "--state=/var/lib/ray/restarts.json", "ib0", "10.0.0.5", "t", "--", "ray"]) \
        == (60, "/var/lib/ray/restarts.json", ["ib0", "10.0.0.5", "t", "--", "ray"])
    assert mod.options(["--backoff-max=0", "--state=/x", "ib0"]) == (0, "", ["ib0"])
    assert mod.options(["--backoff-max=soon", "--state=/x", "ib0"]) == (0, "", ["ib0"])
    assert mod.options(["ib0", "--backoff-max=60"]) == (0, "", ["ib0", "--backoff-max=60"])


def test_it_waits_and_says_so_after_repeated_stops_then_starts(tmp_path, token):
    import json
    import time

    record = tmp_path / "restarts.json"
    now = time.time()
    record.write_text(json.dumps({"stops": [now - 20, now - 10, now - 5], "stopping": False}))
    began = time.monotonic()
    run = subprocess.run([sys.executable, str(SCRIPT), "--backoff-max=1", f"--state={record}", "lo", "127.0.0.1",
                          str(token), "--", "/bin/echo", "started"], capture_output=True, text=True, check=False)
    assert (run.returncode, run.stdout.strip()) == (0, "started")
    assert "Ray stopped by itself 3 times in the last 10 minutes; starting it again in 1 s" in run.stderr
    assert time.monotonic() - began >= 0.75
    # After a deliberate stop the next start does not wait.
    env = dict(os.environ, MAINPID="4242")
    for mode in ("--stopping", "--stopped"):
        subprocess.run([sys.executable, str(SCRIPT), mode, str(record)], env=env, check=True)
    run = subprocess.run([sys.executable, str(SCRIPT), "--backoff-max=1", f"--state={record}", "lo", "127.0.0.1",
                          str(token), "--", "/bin/echo", "started"], capture_output=True, text=True, check=False)
    assert (run.returncode, run.stdout.strip(), run.stderr) == (0, "started", "")


def test_a_deliberate_stop_cut_short_still_clears_the_count_at_the_next_start(tmp_path, token):
    """A reboot whose shutdown killed Ray before ExecStopPost ran: ExecStop had marked the stop as asked for."""
    import json
    import time

    record = tmp_path / "restarts.json"
    now = time.time()
    record.write_text(json.dumps({"stops": [now - 20, now - 10, now - 5], "stopping": True}))
    run = subprocess.run([sys.executable, str(SCRIPT), "--backoff-max=30", f"--state={record}", "lo", "127.0.0.1",
                          str(token), "--", "/bin/echo", "started"], capture_output=True, text=True, check=False,
                         timeout=25)
    assert (run.returncode, run.stdout.strip(), run.stderr) == (0, "started", "")
    assert json.loads(record.read_text()) == {"stops": [], "stopping": False}
