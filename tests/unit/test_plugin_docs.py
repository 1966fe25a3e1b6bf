"""Every plugin's DOCUMENTATION, EXAMPLES and RETURN strings are YAML that ansible-doc can read.

A plain YAML scalar with ": " in it ("in one module run: one round trip") is a parse error that
ansible-lint only prints as a warning and no other test saw; ansible-doc then shows nothing.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = sorted(p for p in (ROOT / "plugins").rglob("*.py") if p.name != "__init__.py")


def doc_strings(path):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.startswith(("DOCUMENTATION", "EXAMPLES", "RETURN")) and isinstance(node.value, ast.Constant):
                yield name, node.value.value


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugin_docs_are_yaml(path):
    for name, text in doc_strings(path):
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as err:
            pytest.fail("%s %s is not YAML: %s" % (path.relative_to(ROOT), name, err))
        if name.startswith("DOCUMENTATION"):
            assert isinstance(loaded, dict) and loaded.get("short_description"), (path, name)
            assert all(isinstance(d, str) for d in loaded.get("description", [])), (path, name)


def test_the_plugins_have_docs_to_check():
    assert sum(1 for p in PLUGINS for _ in doc_strings(p)) >= 10
