"""Each role README's options section is what aar-doc generates from meta/argument_specs.yml (`make docs`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "role_docs.py"
ROLES = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def check(*args):
    return subprocess.run([sys.executable, str(TOOL), "--check", *args], capture_output=True, text=True, check=False)


def generated(role):
    text = (ROOT / "roles" / role / "README.md").read_text()
    return text.split("<!-- BEGIN_ANSIBLE_DOCS -->\n", 1)[1].split("<!-- END_ANSIBLE_DOCS -->\n", 1)[0]


def test_every_role_readme_is_up_to_date():
    proc = check()
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_changed_description_makes_the_check_fail_naming_the_readme(tmp_path):
    role = tmp_path / "roles" / "ray"
    shutil.copytree(ROOT / "roles" / "ray" / "meta", role / "meta")
    shutil.copyfile(ROOT / "roles" / "ray" / "README.md", role / "README.md")
    spec = role / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace("Raylet node manager port.", "Raylet node manager port (changed)."))
    proc = check("--roles-dir", str(tmp_path / "roles"))
    assert proc.returncode == 1
    assert f"{role / 'README.md'} is stale" in proc.stderr and "make docs" in proc.stderr
    assert "+| `ray_node_manager_port` | int | `6380` | Raylet node manager port (changed). |" in proc.stdout


@pytest.mark.parametrize("role", ROLES)
def test_each_option_is_one_table_row(role):
    """Entry points sharing main's options are named once, not given a copy of the table each."""
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    section = generated(role)
    for name in specs["main"]["options"]:
        assert len(re.findall(rf"^\| `{name}` \|", section, re.M)) == 1, f"{role}: {name}"
    for entry_point in specs:
        assert f"`{entry_point}`" in section, f"{role}: entry point {entry_point} not named"


@pytest.mark.parametrize("role", ROLES)
def test_tables_have_four_cells_per_row(role):
    """An unescaped | in a description or default would split a cell and break the table."""
    for line in generated(role).splitlines():
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line)[1:-1]
            assert len(cells) == 4, line
