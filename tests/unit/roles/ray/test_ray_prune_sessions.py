"""roles/ray/files/ray-prune-sessions: old session directories go, the live one and recent ones stay."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[4] / "roles" / "ray" / "files" / "ray-prune-sessions"
DAY = 86400


def session(temp: Path, name: str, age_days: float) -> Path:
    path = temp / name
    (path / "logs").mkdir(parents=True)
    (path / "logs" / "raylet.out").write_text("x" * 4096)
    when = time.time() - age_days * DAY
    os.utime(path, (when, when))
    return path


def prune(temp: Path, days: str = "7"):
    return subprocess.run(["sh", str(SCRIPT), str(temp), days], capture_output=True, text=True, timeout=30)


def test_old_sessions_go_the_live_and_recent_ones_stay(tmp_path):
    old = session(tmp_path, "session_2026-01-01_00-00-00_000001_100", 30)
    almost = session(tmp_path, "session_2026-11-18_00-00-00_000001_200", 6)
    # The live session is old too (a node that ran for a month): never removed.
    live = session(tmp_path, "session_2026-10-01_00-00-00_000001_300", 50)
    (tmp_path / "session_latest").symlink_to(live.name)
    other = tmp_path / "spill"  # not a session: never touched
    other.mkdir()
    os.utime(other, (0, 0))

    proc = prune(tmp_path)

    assert proc.returncode == 0, proc.stderr
    assert not old.exists()
    assert almost.exists() and live.exists() and other.exists()
    assert (tmp_path / "session_latest").resolve() == live.resolve()
    assert f"removed {old}" in proc.stdout
    assert "1 removed, 1 recent kept" in proc.stdout and str(live) in proc.stdout


def test_without_a_live_session_only_age_counts(tmp_path):
    old = session(tmp_path, "session_2026-01-01_00-00-00_000001_100", 8)
    proc = prune(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not old.exists()
    assert "live session none kept" in proc.stdout


def test_a_missing_temp_dir_is_nothing_to_do(tmp_path):
    assert prune(tmp_path / "absent").returncode == 0


def test_days_must_be_a_whole_number(tmp_path):
    proc = prune(tmp_path, "7d")
    assert proc.returncode == 2 and "DAYS must be a whole number" in proc.stderr


def test_a_session_that_cannot_go_does_not_stop_the_others(tmp_path):
    temp = tmp_path / "temp"
    stuck = session(temp, "session_2026-01-01_00-00-00_000001_100", 30)
    old = session(temp, "session_2026-01-02_00-00-00_000001_200", 30)
    # An rm that fails on the first session, as it does on files of another user.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rm").write_text(f"#!/bin/sh\ncase \"$*\" in *{stuck.name}*) echo 'rm: Permission denied' >&2; exit 1;; esac\n"
                                "exec /bin/rm \"$@\"\n")
    (bin_dir / "rm").chmod(0o755)
    proc = subprocess.run(["sh", str(SCRIPT), str(temp), "7"], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"))
    assert proc.returncode == 1, proc
    assert f"could not remove all of {stuck}" in proc.stderr and "1 could not be removed" in proc.stderr
    assert not old.exists() and f"removed {old}" in proc.stdout and stuck.exists()
