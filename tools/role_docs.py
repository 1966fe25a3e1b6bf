#!/usr/bin/env python3
"""Generate the options section of every roles/*/README.md from its meta/argument_specs.yml with aar-doc.

aar-doc (pinned in requirements-dev.txt) renders docs/templates/role-options.md.j2 in inject mode: only the
lines between <!-- BEGIN_ANSIBLE_DOCS --> and <!-- END_ANSIBLE_DOCS --> are replaced; the rest of each README
is written by hand. Settings are in .aar_doc.yml, so `aar-doc roles/ray markdown` by hand gives the same result.

    tools/role_docs.py            rewrite the READMEs (`make docs`)
    tools/role_docs.py --check    render into a temporary copy and fail, naming each stale README (`make lint`)
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".aar_doc.yml"
BEGIN, END = "<!-- BEGIN_ANSIBLE_DOCS -->", "<!-- END_ANSIBLE_DOCS -->"


def aar_doc() -> str:
    """The aar-doc next to this interpreter (the project venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "aar-doc"
    found = str(beside) if beside.exists() else shutil.which("aar-doc")
    if not found:
        sys.exit("aar-doc is not installed: run `make venv` (it is pinned in requirements-dev.txt)")
    return found


def roles(roles_dir: Path) -> list[Path]:
    return sorted(p for p in roles_dir.iterdir() if (p / "meta" / "argument_specs.yml").is_file())


def render(exe: str, role: Path, output: Path) -> None:
    """Inject the generated section into `output` (a README, or a copy of one)."""
    text = output.read_text() if output.exists() else ""
    lines = text.splitlines()
    if BEGIN not in lines or END not in lines:
        raise SystemExit(f"{role / 'README.md'}: no {BEGIN} / {END} lines to generate between")
    proc = subprocess.run(
        [exe, "--config-file", str(CONFIG), "--output-file", str(output.resolve()), str(role), "markdown"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"aar-doc failed on {role}:\n{proc.stdout}{proc.stderr}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a README differs from its spec")
    parser.add_argument("--roles-dir", type=Path, default=ROOT / "roles", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    exe = aar_doc()
    targets = roles(args.roles_dir)
    if not args.check:
        with ThreadPoolExecutor() as pool:
            list(pool.map(lambda role: render(exe, role, role / "README.md"), targets))
        return 0
    stale = []
    with tempfile.TemporaryDirectory(prefix="role-docs-") as tmp:
        copies = {role: Path(tmp) / f"{role.name}.md" for role in targets}
        for role, copy in copies.items():
            shutil.copyfile(role / "README.md", copy)
        with ThreadPoolExecutor() as pool:
            list(pool.map(lambda role: render(exe, role, copies[role]), targets))
        for role, copy in copies.items():
            readme = role / "README.md"
            old, new = readme.read_text(), copy.read_text()
            if old != new:
                shown = readme.relative_to(ROOT) if readme.is_relative_to(ROOT) else readme
                stale.append(str(shown))
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(keepends=True), new.splitlines(keepends=True),
                    f"{shown} (committed)", f"{shown} (from meta/argument_specs.yml)"))
    for name in stale:
        print(f"{name} is stale: its options section differs from meta/argument_specs.yml; "
              "run `make docs` and commit the result", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
