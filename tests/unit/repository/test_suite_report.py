"""tools/suite_report.py: the table `make test` prints at its end (phases with their CPU, the whole machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
REPORT = ROOT / "tools" / "suite_report.py"


def report(directory: Path) -> str:
    return subprocess.run([sys.executable, str(REPORT), str(directory)], check=True, capture_output=True,
                          text=True).stdout


def test_phases_print_minutes_and_cpu_and_the_machine_its_cores(tmp_path):
    (tmp_path / "phases.tsv").write_text(
        "unit\t1000\t1300\t0\t240.4\n"
        "lab 1: end-to-end tests\t1060\t3760\t1\t1250.0\n"
        "an older line without CPU\t1000\t1060\t0\n"
        "not a phase\n")
    (tmp_path / "cpu.start").write_text("100000 1000\n")
    (tmp_path / "cpu.end").write_text("640000 3760\n")
    out = report(tmp_path)
    lines = {line.split("  ")[1].strip(): line for line in out.splitlines() if line.startswith("  ") and "  " in line[2:]}
    assert "5.0" in lines["unit"] and "240" in lines["unit"] and lines["unit"].rstrip().endswith("0")
    assert "45.0" in lines["lab 1: end-to-end tests"] and "1250" in lines["lab 1: end-to-end tests"]
    assert "an older line without CPU" in out and "not a phase" not in out
    assert "wall, first phase to last" in out and "46.0" in out
    # (640000 - 100000) jiffies = 5400 CPU-s in 2760 s: 1.96 cores.
    assert "the whole machine: 5400 CPU-seconds busy in 46.0 minutes, 1.96 cores on average" in out


def test_nothing_to_report_prints_nothing_and_never_fails(tmp_path):
    (tmp_path / "cpu.start").write_text("garbage\n")
    assert report(tmp_path) == ""


def test_playbook_runs_are_counted_per_lab_and_the_costliest_named(tmp_path):
    (tmp_path / "playbooks-lab1.tsv").write_text(
        "session\tsite.yml\t\t480.0\t55.0\t170.0\t450\t80\n"
        "test_a.py::test_x\tsite.yml\t-e raymetal_fast_path\t40.0\t30.0\t20.0\t303\t0\n"
        "test_a.py::test_y\tsite.yml\t--check --diff\t10.0\t3.0\t1.0\t12\t0\n"
        "a torn line\tsite.yml\n")
    (tmp_path / "playbooks-lab2.tsv").write_text("test_b.py::test_z\tupgrade.yml\t\t300.0\t90.0\t110.0\t500\t40\n")
    out = report(tmp_path)
    assert "lab1: 3 runs,    279 CPU-s (controller     88)," in out
    assert "lab2: 1 runs,    200 CPU-s (controller     90)" in out
    lines = out.split("the ten that cost the most CPU:")[1].strip().splitlines()
    assert [line.split("<- ")[1] for line in lines] == ["session", "test_b.py::test_z", "test_a.py::test_x",
                                                         "test_a.py::test_y"]
    assert "site.yml -e raymetal_fast_path" in lines[2] and "ok  303" in lines[2]
