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


def a_run(directory: Path, *phase_lines: str):
    """phases.tsv with these lines, and the whole machine 5400 CPU-s busy from second 1000 to 3760."""
    (directory / "phases.tsv").write_text("".join(line + "\n" for line in phase_lines))
    (directory / "cpu.start").write_text("100000 1000\n")
    (directory / "cpu.end").write_text("640000 3760\n")


def test_phases_print_minutes_and_cpu_and_the_machine_its_cores(tmp_path):
    a_run(tmp_path, "unit\t1000\t1300\t0\t240.4", "lab 1: end-to-end tests\t1060\t3760\t1\t1250.0",
          "an older line without CPU\t1000\t1060\t0", "not a phase")
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


def test_the_machine_s_cpu_is_split_between_the_phases_the_labs_and_the_rest(tmp_path):
    a_run(tmp_path, "setup: OS packages, venv\t1000\t1100\t0\t100.0", "lint\t1100\t1500\t0\t300.0",
          "unit\t1100\t1600\t0\t400.0", "molecule default (Debian bookworm)\t1100\t1200\t0\t50.0",
          "molecule cluster (Debian trixie)\t1200\t2000\t0\t250.0", "lab 1: end-to-end tests\t1100\t3760\t0\t1250.0")
    (tmp_path / "cost-lab1.tsv").write_text(
        "the session's first deploy (the cluster fixture)\t480.0\t60.0\t180.0\n"
        "tests/lab/test_a.py::test_x\t300.0\t110.0\t400.0\n")
    (tmp_path / "playbooks-lab1.tsv").write_text(
        "session\tsite.yml\t\t480.0\t55.0\t170.0\t450\t80\n"
        "test_a.py::test_x\tsite.yml\t\t40.0\t30.0\t20.0\t303\t0\n")
    out = report(tmp_path).split("=== where the machine's CPU went")[1]
    rows = {line.split("%", 1)[1].strip(): line.split("CPU-s")[0].strip() for line in out.strip().splitlines()
            if "CPU-s" in line and "%" in line}
    assert rows["lint, unit and the setup (their own processes)"] == "800"
    assert rows["molecule (its Ansible; its containers are in the last row)"] == "300"
    assert rows["lab1: its playbook runs (controller and nodes)"] == "275"
    # Nodes 580 in the tests, 190 of it in playbook runs; controller 170 in the tests, 85 in playbook runs.
    assert rows["lab1: its nodes outside playbook runs (Ray running, the tests' jobs and faults)"] == "390"
    assert rows["lab1: the tests' own commands on the controller"] == "85"
    # 5400 busy, 1850 of it counted above.
    assert rows["the rest (molecule's containers, the labs before and after their tests, Docker, the machine)"] == "3550"
    assert "65.7 %  the rest" in out


def test_the_timeline_gives_each_lab_molecule_and_the_rest_their_cores_per_five_minutes(tmp_path):
    # Every 150 s: the machine 300 CPU-s busy (2 cores); lab raymetal's container 150 CPU-s (1 core), molecule's
    # container 30 (0.2), lint and unit 15 (0.1). A container that appears later counts from its second sample; one that is gone, no more.
    lines = []
    for step in range(5):
        t = 1000 + 150 * step
        lines.append(f"{t} machine {30000 * step}")
        lines.append(f"{t} background {15 * step * 10**9}")
        lines.append(f"{t} aaaa raymetal {150 * step * 10**9}")
        if step < 3:
            lines.append(f"{t} bbbb - {30 * step * 10**9}")
        if step >= 3:
            lines.append(f"{t} cccc raymetal-lab2 {(step - 3) * 75 * 10**9 + 500 * 10**9}")
    (tmp_path / "cpu-timeline.tsv").write_text("\n".join(lines + ["garbage line"]) + "\n")
    out = report(tmp_path)
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and line.split()[0].isdigit()]
    header = next(line.split() for line in out.splitlines() if line.strip().startswith("minute"))
    assert header == ["minute", "machine", "raymetal", "raymetal-lab2", "molecule", "background", "outside"], out
    # Minutes 0-5: two intervals, molecule's container in both; minutes 5-10: two, lab 2's in the second only.
    # Lint and unit (background) 0.1 core throughout.
    assert rows[0] == ["0", "2.00", "1.00", "0.00", "0.20", "0.10", "0.70"], out
    assert rows[1] == ["5", "2.00", "1.00", "0.25", "0.00", "0.10", "0.65"], out
