"""Every role keeps its interface honest: defaults == argument specs == README.

Like prometheus-community's lint_arguments_spec check: a variable added to
defaults/main.yml without a spec and a README entry fails here.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
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
