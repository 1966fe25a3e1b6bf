"""Every role keeps its interface honest: defaults == argument specs == README.

Like prometheus-community's lint_arguments_spec check: a variable added to
defaults/main.yml without a spec and a README entry fails here.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())


def test_roles_exist():
    assert {"ray", "fabric", "nccl", "nvidia_driver", "firewall"} <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_role_name_is_valid(role):
    assert re.fullmatch(r"[a-z][a-z0-9_]*", role)


@pytest.mark.parametrize("role", ROLES)
def test_defaults_match_argument_specs_and_readme(role):
    path = ROOT / "roles" / role
    defaults = yaml.safe_load((path / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((path / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    readme = (path / "README.md").read_text()
    for name in defaults:
        assert name.startswith(role + "_") or name.startswith("__"), f"{role}: {name} lacks the role prefix"
    public = {n for n in defaults if not n.startswith("__")}
    main = set(specs["main"]["options"])
    assert public - main == set(), f"{role}: defaults without a spec: {sorted(public - main)}"
    assert main - public == set(), f"{role}: specs without a default: {sorted(main - public)}"
    for name, spec in specs["main"]["options"].items():
        assert spec.get("description"), f"{role}: {name} has no description"
    undocumented = sorted(n for n in public if n not in readme)
    assert undocumented == [], f"{role}: README does not mention {undocumented}"


@pytest.mark.parametrize("role", ROLES)
def test_spec_defaults_equal_the_role_defaults(role):
    """The default a spec documents is the one the role uses (templated defaults excepted: they are computed)."""
    path = ROOT / "roles" / role
    defaults = yaml.safe_load((path / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((path / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    differ = []
    for name, spec in specs["main"]["options"].items():
        value = defaults.get(name)
        if isinstance(value, str) and "{{" in value:
            continue
        documented = spec.get("default")
        if spec.get("type") in ("str", "path") and value is not None and documented is not None:
            value, documented = str(value), str(documented)
        if documented != value:
            differ.append(f"{name}: spec {documented!r}, defaults/main.yml {value!r}")
    assert differ == [], f"{role}: " + "; ".join(differ)


@pytest.mark.parametrize("role", ROLES)
def test_every_entry_point_shares_the_main_options(role):
    """Entry points take the same variables as main (one definition, YAML anchors), and have a tasks file."""
    path = ROOT / "roles" / role
    specs = yaml.safe_load((path / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry, spec in specs.items():
        assert spec.get("options") == specs["main"]["options"], f"{role}: entry point {entry} has its own options"
        assert (path / "tasks" / f"{entry}.yml").is_file(), f"{role}: entry point {entry} has no tasks/{entry}.yml"


def test_the_sample_inventory_lists_every_role_variable_and_is_current():
    """inventory/sample/group_vars/all/*.yml: every public variable of every role, at its spec default."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "sample_group_vars.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sample = "\n".join(p.read_text() for p in sorted((ROOT / "inventory" / "sample" / "group_vars" / "all").glob("*.yml")))
    for role in ROLES:
        specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        missing = [n for n in specs["main"]["options"] if f"\n# {n}: " not in sample]
        assert missing == [], f"{role}: not in the sample inventory: {missing}"


def _role_calls():
    """(file, role, tasks file) for every role a playbook imports or includes by tasks_from."""
    for path in sorted((ROOT / "playbooks").rglob("*.yml")):
        for match in re.finditer(r"name: (?:raymetal\.cluster\.)?(\w+)\n\s+tasks_from: ([\w-]+)\.yml", path.read_text()):
            yield path.relative_to(ROOT), match.group(1), match.group(2)


def test_every_entry_point_a_playbook_calls_has_an_argument_spec():
    """A tasks_from without a spec entry is called with unchecked variables (Ansible validates only specced entry points).
    An entry point that holds no task (one that puts a role's defaults in scope, as the full path per role's digest
    needs) runs nothing with them, and a spec would only add a validation task per host."""
    calls = list(_role_calls())
    assert len(calls) > 10, calls
    unspecced = []
    for path, role, entry in calls:
        specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        if yaml.safe_load((ROOT / "roles" / role / "tasks" / f"{entry}.yml").read_text()) == []:
            assert entry not in specs, f"{role}: tasks/{entry}.yml holds no task, so its spec only costs a task per host"
            continue
        if entry not in specs:
            unspecced.append(f"{path}: {role} tasks_from {entry}.yml")
    assert unspecced == []
