"""Every plugin's DOCUMENTATION, EXAMPLES and RETURN strings are YAML that ansible-doc can read.

A plain YAML scalar with ": " in it ("in one module run: one round trip") is a parse error that
ansible-lint only prints as a warning and no other test saw; ansible-doc then shows nothing.

Filters are documented in sidecar files, plugins/filter/<name>.yml (as community.general does):
every filter a FilterModule exposes has one, and `ansible-doc -t filter` shows each of them from the
collection as installed here (collections/ansible_collections/raymetal/cluster links to this tree).
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = sorted(p for p in (ROOT / "plugins").rglob("*.py") if p.name != "__init__.py")
FILTER_DIR = ROOT / "plugins" / "filter"
ANSIBLE_DOC = Path(sys.executable).parent / "ansible-doc"


def exposed_filters():
    """{filter name: module file} for every filter the collection's FilterModules expose."""
    found = {}
    for path in sorted(FILTER_DIR.glob("*.py")):
        module = importlib.import_module("ansible_collections.raymetal.cluster.plugins.filter." + path.stem)
        for name in module.FilterModule().filters():
            assert name not in found, "filter %s is exposed by %s and %s" % (name, found[name], path.name)
            found[name] = path.name
    return found


FILTERS = exposed_filters()


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
            # Every option's description too, suboptions included (a ": " in a list item made one a mapping).
            assert not _not_text(loaded.get("options") or {}), (path, name, _not_text(loaded.get("options") or {}))


def _not_text(options, prefix=""):
    """The options (dotted) whose description is not a string or a list of strings."""
    bad = []
    for key, spec in options.items():
        text = spec.get("description")
        if not (isinstance(text, str) or (isinstance(text, list) and all(isinstance(d, str) for d in text))):
            bad.append(prefix + key)
        bad += _not_text(spec.get("suboptions") or {}, prefix + key + ".")
    return bad


def test_the_plugins_have_docs_to_check():
    assert sum(1 for p in PLUGINS for _ in doc_strings(p)) >= 10


def test_the_collection_has_filters_to_check():
    assert len(FILTERS) >= 40


def test_every_sidecar_belongs_to_a_filter():
    sidecars = {p.stem for p in FILTER_DIR.glob("*.yml")}
    assert sidecars - set(FILTERS) == set(), "sidecar docs for filters no FilterModule exposes"


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_filter_sidecar_doc(name):
    path = FILTER_DIR / (name + ".yml")
    assert path.is_file(), "filter %s (%s) has no documentation: add plugins/filter/%s.yml" % (
        name, FILTERS[name], name)
    data = yaml.safe_load(path.read_text())
    doc = data["DOCUMENTATION"]
    assert doc["name"] == name
    assert doc.get("short_description") and doc.get("description"), path
    assert all(isinstance(d, str) and d.strip() for d in doc["description"]), path
    options = doc.get("options") or {}
    assert "_input" in options and options["_input"].get("description"), "%s: document the piped value as _input" % path
    assert all(opt.get("description") for opt in options.values()), path
    for arg in [a.strip() for a in str(doc.get("positional") or "").split(",") if a.strip()]:
        assert arg in options, "%s: positional %s is not an option" % (path, arg)
    assert "raymetal.cluster.%s" % name in data["EXAMPLES"], "%s: EXAMPLES should call the filter by FQCN" % path
    assert data["RETURN"]["_value"].get("description") and data["RETURN"]["_value"].get("type"), path


@pytest.fixture(scope="module")
def ansible_doc_env():
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_COLLECTIONS_PATHS", None)
    return env


def test_ansible_doc_lists_every_filter_with_its_sidecar_summary(ansible_doc_env):
    proc = subprocess.run([str(ANSIBLE_DOC), "-t", "filter", "--list", "--json", "raymetal.cluster"],
                          env=ansible_doc_env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    expected = {}
    for name in FILTERS:
        sidecar = FILTER_DIR / (name + ".yml")
        if sidecar.is_file():
            expected["raymetal.cluster." + name] = yaml.safe_load(sidecar.read_text())["DOCUMENTATION"][
                "short_description"]
    assert set(listed) == {"raymetal.cluster." + name for name in FILTERS}
    wrong = {name: listed[name] for name in listed if listed[name] != expected.get(name)}
    assert wrong == {}, "ansible-doc --list does not show these filters' own short_description"


def test_ansible_doc_shows_every_filter(ansible_doc_env):
    names = ["raymetal.cluster." + name for name in sorted(FILTERS)]
    proc = subprocess.run([str(ANSIBLE_DOC), "-t", "filter", "--json"] + names,
                          env=ansible_doc_env, capture_output=True, text=True, timeout=900, check=False)
    # One filter without documentation makes ansible-doc print none at all; its error names that filter.
    assert proc.returncode == 0, "ansible-doc failed: %s" % proc.stderr[-2000:]
    shown = json.loads(proc.stdout)
    missing = [name for name in names if not (shown.get(name) or {}).get("doc")]
    assert missing == [], "ansible-doc shows no documentation for %s" % missing
    for name in names:
        entry = shown[name]
        assert entry["doc"]["name"] == name.rsplit(".", 1)[1]
        assert entry["doc"].get("description") and entry.get("examples") and entry.get("return"), name
