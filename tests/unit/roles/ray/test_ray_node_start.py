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
