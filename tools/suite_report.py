#!/usr/bin/env python3
"""The end of `make test`: how long each phase took, and the slowest tests.

    tools/suite_report.py [ARTIFACTS_DIR]   (default: artifacts)

Reads ARTIFACTS_DIR/phases.tsv (one line per phase, written by tools/timed.sh:
name, start and end in epoch seconds, exit status, and the CPU-seconds of the
phase's own processes, containers not included) and every pytest JUnit XML
report there (junit-*.xml: the unit tests and each lab's end-to-end tests), and
prints the phases in the order they started, with their minutes and the
minutes since the first phase began, then the ten slowest tests. Phases run
side by side, so their minutes add up to more than the wall time.
ARTIFACTS_DIR/cost-*.tsv (one line per lab test: name, wall seconds, controller
CPU-seconds, the lab containers' CPU-seconds; tests/lab/conftest.py writes them)
gives each lab's CPU and the ten tests that cost the most CPU: the machine is
CPU-bound, so that is where a faster suite comes from. ARTIFACTS_DIR/playbooks-*.tsv
(one line per playbook run of the lab tests: test, playbook, options, wall
seconds, controller and node CPU-seconds, ok and changed task-host pairs) gives
each lab's number of runs and the ten runs that cost the most CPU.
Then where the whole machine's busy CPU (cpu.start and cpu.end: /proc/stat's jiffies) went: lint, unit and the
setup, molecule's Ansible, each lab's playbook runs, its nodes outside them (Ray running between runs, the
tests' jobs and faults) and its tests' other commands, and the rest, which none of these files counts.
ARTIFACTS_DIR/cpu-timeline.tsv (tools/cpu_timeline.sh: the machine's busy jiffies and every container's CPU, sampled
every 15 s) gives, per 5 minutes, the cores each lab's containers used, the other containers (molecule's nodes), lint
and unit (tools/background.sh's cgroup) and everything else (ansible, pytest, molecule's controller, Docker): where
the machine was full and where it waited.
Prints nothing about a file that is not there; never fails the build.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def phases(path: Path) -> list[tuple[str, float, float, str, str]]:
    """(name, start, end, exit status, CPU-seconds or '') per phase; an older 4-field line has no CPU."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) not in (4, 5):
            continue
        name, start, end, rc = parts[:4]
        cpu = parts[4] if len(parts) == 5 else ""
        try:
            rows.append((name, float(start), float(end), rc, "%.0f" % float(cpu) if cpu else ""))
        except ValueError:
            continue
    return sorted(rows, key=lambda row: row[1])


def machine_busy(directory: Path) -> tuple[float, float] | None:
    """(busy CPU-seconds of the whole machine, seconds) between cpu.start and cpu.end (jiffies from /proc/stat,
    written by `make test`), or None."""
    try:
        first, second = ((directory / name).read_text().split() for name in ("cpu.start", "cpu.end"))
        busy = (float(second[0]) - float(first[0])) / 100
        seconds = float(second[1]) - float(first[1])
    except (OSError, ValueError, IndexError):
        return None
    return (busy, seconds) if seconds > 0 else None


def slowest(directory: Path, count: int = 10) -> list[tuple[float, str, str]]:
    tests = []
    for report in sorted(directory.glob("junit-*.xml")):
        try:
            root = ET.parse(report).getroot()
        except (ET.ParseError, OSError):
            continue
        source = report.stem.removeprefix("junit-")
        for case in root.iter("testcase"):
            try:
                seconds = float(case.get("time", "0"))
            except ValueError:
                continue
            name = f"{case.get('classname', '')}::{case.get('name', '')}".replace("tests.", "", 1)
            tests.append((seconds, name, source))
    return sorted(tests, reverse=True)[:count]


def tsv_lines(directory: Path, prefix: str, fields: int):
    """(lab, fields) of every line of ARTIFACTS_DIR/<prefix>-<lab>.tsv with that many tab-separated fields."""
    for path in sorted(directory.glob(f"{prefix}-*.tsv")):
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == fields:
                yield path.stem.removeprefix(f"{prefix}-"), parts


def costs(directory: Path) -> list[tuple[float, float, float, str, str]]:
    rows = []
    for lab, parts in tsv_lines(directory, "cost", 4):
        try:
            wall, controller, nodes = (float(p) for p in parts[1:])
        except ValueError:
            continue
        rows.append((controller + nodes, controller, wall, parts[0].replace("tests/lab/", ""), lab))
    return rows


def playbook_runs(directory: Path) -> list[tuple[float, float, float, int, str, str, str]]:
    rows = []
    for lab, parts in tsv_lines(directory, "playbooks", 8):
        try:
            wall, controller, nodes = (float(p) for p in parts[3:6])
            ok = int(parts[6])
        except ValueError:
            continue
        rows.append((controller + nodes, controller, wall, ok, f"{parts[1]} {parts[2]}".strip(), parts[0], lab))
    return rows


def breakdown(phase_rows: list[tuple], busy: float, spent: list[tuple], runs: list[tuple]) -> list[tuple[str, float]]:
    """Where the whole machine's `busy` CPU-seconds went, [(what, CPU-seconds)], from the phases, the lab tests'
    costs and their playbook runs read above; the last row is what none of them counts (molecule's containers,
    the labs' containers outside their tests, Docker, the machine's own)."""
    checks, molecule = 0.0, 0.0
    for name, _, _, _, cpu in phase_rows:
        if not cpu:
            continue
        if name.startswith("molecule"):
            molecule += float(cpu)
        elif name in ("lint", "unit") or name.startswith("setup"):
            checks += float(cpu)
    rows = [("lint, unit and the setup (their own processes)", checks),
            ("molecule (its Ansible; its containers are in the last row)", molecule)]
    for lab in sorted({row[4] for row in spent} | {row[6] for row in runs}):
        run_controller = sum(row[1] for row in runs if row[6] == lab)
        run_nodes = sum(row[0] - row[1] for row in runs if row[6] == lab)
        test_controller = sum(row[1] for row in spent if row[4] == lab)
        test_nodes = sum(row[0] - row[1] for row in spent if row[4] == lab)
        rows += [(f"{lab}: its playbook runs (controller and nodes)", run_controller + run_nodes),
                 (f"{lab}: its nodes outside playbook runs (Ray running, the tests' jobs and faults)",
                  max(test_nodes - run_nodes, 0.0)),
                 (f"{lab}: the tests' own commands on the controller", max(test_controller - run_controller, 0.0))]
    rows.append(("the rest (molecule's containers, the labs before and after their tests, Docker, the machine)",
                 busy - sum(cpu for _, cpu in rows)))
    return rows


_TIMELINE_UNITS = {"machine": 100, "background": 1e9}


def timeline(path: Path, bucket: int = 300) -> tuple[list[str], list[tuple[float, dict[str, float]]]]:
    """(columns, [(minute, {column: cores})]) per `bucket` seconds from cpu-timeline.tsv: 'machine', each lab's
    containers by their label, 'molecule' (containers with no lab label), 'background' (tools/background.sh's cgroup:
    lint and unit) where sampled, and 'outside' (the machine less all of these)."""
    if not path.exists():
        return [], []
    samples: dict[int, dict[str, tuple[str, float]]] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        try:
            if len(parts) == 3 and parts[1] in _TIMELINE_UNITS:  # the machine (jiffies) and the background (ns)
                samples.setdefault(int(parts[0]), {})[parts[1]] = (parts[1], float(parts[2]) / _TIMELINE_UNITS[parts[1]])
            elif len(parts) == 4:
                samples.setdefault(int(parts[0]), {})[parts[1]] = (parts[2], float(parts[3]) / 1e9)
        except ValueError:
            continue
    times = sorted(samples)
    if len(times) < 2:
        return [], []
    start, spent = times[0], {}
    for before, after in zip(times, times[1:]):
        row = spent.setdefault((before - start) // bucket, {})
        for key, (label, value) in samples[after].items():
            if key in samples[before]:
                column = key if key in _TIMELINE_UNITS else ("molecule" if label == "-" else label)
                row[column] = row.get(column, 0.0) + max(0.0, value - samples[before][key][1])
    seen = {column for row in spent.values() for column in row}
    labs = sorted(seen - {"machine", "molecule", "background"})
    columns = ["machine", *labs, "molecule", *(["background"] if "background" in seen else []), "outside"]
    result = []
    for index in sorted(spent):
        row = spent[index]
        seconds = min(bucket, times[-1] - start - index * bucket)
        if seconds <= 0:
            continue
        row["outside"] = row.get("machine", 0.0) - sum(value for column, value in row.items() if column != "machine")
        result.append((index * bucket / 60, {column: row.get(column, 0.0) / seconds for column in columns}))
    return columns, result


def per_lab(rows: list[tuple], lab_at: int) -> list[tuple[str, list[tuple]]]:
    """The rows grouped by their lab (the field at lab_at), labs in order."""
    return [(lab, [row for row in rows if row[lab_at] == lab]) for lab in sorted({row[lab_at] for row in rows})]


def main(argv: list[str]) -> int:
    directory = Path(argv[1] if len(argv) > 1 else "artifacts")
    rows = phases(directory / "phases.tsv")
    if rows:
        first = rows[0][1]
        last = max(row[2] for row in rows)
        print("=== make test: phases (side by side where they overlap)")
        print(f"  {'phase':<34} {'minutes':>8} {'from':>7} {'to':>7} {'CPU-s':>7}  exit")
        for name, start, end, rc, cpu in rows:
            print(f"  {name:<34} {(end - start) / 60:8.1f} {(start - first) / 60:7.1f} {(end - first) / 60:7.1f}"
                  f" {cpu:>7}  {rc}")
        print(f"  {'wall, first phase to last':<34} {(last - first) / 60:8.1f}")
        print("  (CPU-s: the phase's own processes, ansible and molecule included; the containers' CPU is not in it)")
    machine = machine_busy(directory)
    if machine:
        busy, seconds = machine
        print(f"=== the whole machine: {busy:.0f} CPU-seconds busy in {seconds / 60:.1f} minutes, "
              f"{busy / seconds:.2f} cores on average")
    columns, spans = timeline(directory / "cpu-timeline.tsv")
    if spans:
        print("=== cores used, per 5 minutes (background: lint and unit; outside: the rest outside containers: "
              "ansible, pytest, molecule's controller, Docker)")
        print("  minute " + " ".join(f"{column:>9}" for column in columns))
        for minute, used in spans:
            print(f"  {minute:6.0f} " + " ".join(f"{used[column]:9.2f}" for column in columns))
    spent, runs = costs(directory), playbook_runs(directory)
    if machine:
        print("=== where the machine's CPU went")
        for what, cpu in breakdown(rows, machine[0], spent, runs):
            print(f"  {cpu:7.0f} CPU-s {100 * cpu / machine[0]:5.1f} %  {what}")
    tests = slowest(directory)
    if tests:
        print("=== the ten slowest tests")
        for seconds, name, source in tests:
            print(f"  {seconds / 60:5.1f} min  {seconds:7.1f} s  [{source}] {name}")
    if spent:
        print("=== CPU of the lab tests (controller: ansible and the tests' own commands; nodes: the lab's containers)")
        for lab, mine in per_lab(spent, 4):
            print(f"  {lab}: {sum(r[2] for r in mine) / 60:5.1f} min of tests, controller "
                  f"{sum(r[1] for r in mine):6.0f} CPU-s, nodes {sum(r[0] - r[1] for r in mine):6.0f} CPU-s")
        print("  the ten that cost the most CPU:")
        for total, controller, wall, name, lab in sorted(spent, reverse=True)[:10]:
            print(f"  {total:6.0f} CPU-s (controller {controller:5.0f}, nodes {total - controller:5.0f}) "
                  f"{wall:6.0f} s  [{lab}] {name}")
    if runs:
        print("=== playbook runs of the lab tests (ok: task-host pairs that ran; a fast-path run has few)")
        for lab, mine in per_lab(runs, 6):
            print(f"  {lab}: {len(mine)} runs, {sum(r[0] for r in mine):6.0f} CPU-s (controller "
                  f"{sum(r[1] for r in mine):6.0f}), {sum(r[2] for r in mine) / 60:5.1f} min")
        print("  the ten that cost the most CPU:")
        for total, controller, wall, ok, run, test, lab in sorted(runs, reverse=True)[:10]:
            print(f"  {total:6.0f} CPU-s (controller {controller:5.0f}) {wall:6.0f} s  ok {ok:4d}  [{lab}] {run}  <- {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
