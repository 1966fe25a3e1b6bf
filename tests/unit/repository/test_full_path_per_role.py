"""The full path per role (playbooks/apply.yml) leaves a role alone on a node where the role_inputs lookup's digest of
the role's variables (every name with the role's prefix, resolved) is the recorded one. That is only sound while the
role's tasks, templates and variables read nothing else: another role's variable, or another host's through
`hostvars` or `groups[...]`, would change what the role writes without changing its digest. These tests hold each
role that apply.yml skips that way to it."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
APPLY = REPO / "playbooks" / "apply.yml"
NAME = re.compile(r"\b_*[a-z][a-z0-9_]*\b")
INCLUDES = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks", "include_tasks", "import_tasks")


def gated_imports():
    """{role: its entry point} for each role apply.yml applies in a play of its own whose hosts are the nodes where
    raymetal.cluster.role_converges says it runs (raymetal_role_hosts[role], playbooks/tasks/role_hosts.yml)."""
    found, decided = {}, set()
    for play in yaml.safe_load(APPLY.read_text()):
        for task in _tasks(play.get("tasks")):
            facts = task.get("ansible.builtin.set_fact")
            for name, value in (facts.items() if isinstance(facts, dict) else ()):
                gate = re.search(r"role_converges\('([a-z_]+)'", str(value))
                if name.startswith("raymetal_role_runs_") and gate:
                    assert name == "raymetal_role_runs_" + gate.group(1), "%s is decided for %s" % (name, gate.group(1))
                    decided.add(gate.group(1))
        gate = re.search(r"raymetal_role_hosts'\]\['([a-z_]+)'\]", str(play.get("hosts", "")))
        if not gate:
            continue
        role = gate.group(1)
        assert role in decided, "the play %r runs where %s is decided, but no earlier play decides it" % (
            play.get("name"), role)
        imports = [task["ansible.builtin.import_role"] for task in _tasks(play.get("tasks"))
                   if isinstance(task.get("ansible.builtin.import_role"), dict)
                   and task["ansible.builtin.import_role"]["name"] == role]
        assert len(imports) == 1, "the play %r imports %s %d times" % (play.get("name"), role, len(imports))
        found[role] = imports[0].get("tasks_from", "main.yml")
    return found


def gated_roles():
    return sorted(gated_imports())


LOOKUP = re.compile(r"lookup\('raymetal\.cluster\.role_inputs',\s*((?:'[a-z_]+',?\s*)+)(?:names=\[([^\]]*)\])?")


@functools.lru_cache(maxsize=None)
def digests():
    """{role: (the lookup's prefixes, its whole names)} for each role whose digest apply.yml takes, and the roles
    grouped all or none (playbooks/tasks/role_hosts.yml with __role_hosts_all_or_none)."""
    found, all_or_none = {}, set()
    for play in yaml.safe_load(APPLY.read_text()):
        for task in _tasks(play.get("tasks")):
            facts = task.get("ansible.builtin.set_fact")
            for name, value in (facts.items() if isinstance(facts, dict) else ()):
                if not name.startswith("raymetal_role_inputs_"):
                    continue
                text = str(value)
                for ref in re.findall(r"__[a-z_]+", text):  # a task var holding the lookup
                    text += " " + str((task.get("vars") or {}).get(ref, ""))
                match = LOOKUP.search(text)
                assert match, "%s is not a raymetal.cluster.role_inputs digest" % name
                found[name[len("raymetal_role_inputs_"):]] = (
                    re.findall(r"'([a-z_]+)'", match.group(1)), re.findall(r"'([a-z_]+)'", match.group(2) or ""))
            tvars = task.get("vars") or {}
            if task.get("ansible.builtin.import_tasks") == "tasks/role_hosts.yml":
                all_or_none |= set(tvars.get("__role_hosts_all_or_none") or [])
    return found, all_or_none


def _tasks(items):
    for item in items or []:
        if isinstance(item, dict):
            yield item
            for key in ("block", "rescue", "always"):
                yield from _tasks(item.get(key))


def reachable_task_files(role):
    """The entry point apply.yml imports and every task file it includes or imports, through any depth (a templated
    name counts as every file it can match)."""
    tasks = REPO / "roles" / role / "tasks"
    entry = gated_imports()[role]
    first = tasks / (entry if entry.endswith(".yml") else entry + ".yml")
    assert first.is_file(), "playbooks/apply.yml imports %s, which does not exist" % first.relative_to(REPO)
    seen, todo = set(), [first]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for task in _tasks(yaml.safe_load(path.read_text())):
            if _checked_before(role, task):
                continue
            for key in INCLUDES:
                target = task.get(key)
                if isinstance(target, dict):
                    target = target.get("file")
                if not isinstance(target, str):
                    continue
                pattern = re.compile("^" + re.sub(r"\\\{\\\{.*?\\\}\\\}", ".*", re.escape(target)) + "$")
                todo.extend(p for p in tasks.glob("*.yml") if pattern.match(p.name))
    return sorted(seen)


CHECK = REPO / "playbooks" / "check.yml"


def _checked_before(role, task):
    """Whether ``task`` includes the role's checks (preflight.yml) behind the guard that they ran already: the
    deploy's check play (playbooks/check.yml, before apply.yml) runs them on every node, and what they publish
    under the role's prefix is in the digest, resolved."""
    target = next((task.get(key) for key in INCLUDES if task.get(key)), None)
    target = target.get("file") if isinstance(target, dict) else target
    guard = "__%s_checked is not defined" % role
    if target != "preflight.yml" or str(task.get("when", "")).strip() != guard:
        return False
    imports = [t.get("ansible.builtin.import_role") for play in yaml.safe_load(CHECK.read_text())
               for t in _tasks(play.get("tasks"))]
    return {"name": role, "tasks_from": "preflight.yml"} in imports


COMMENT = re.compile(r"(^|\s)#.*$")


def without_comments(text):
    """The text less its comments (YAML's, and a template's Jinja comments), which name variables without reading
    them; a comment line that holds a Jinja expression (a template's output) stays."""
    text = re.sub(r"\{#.*?#\}", "", text, flags=re.S)
    return "\n".join(line if "{{" in line.split("#", 1)[-1] or "{%" in line.split("#", 1)[-1]
                     else COMMENT.sub("", line) for line in text.splitlines())


JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)


def read_by(role):
    """The text of what the role's deploy entry point runs: its reachable task files and handlers, the Jinja of its
    templates (their prose names no variable it reads), and each of its vars and defaults that the digest does not
    cover ({path: text}; a variable's text is keyed "path:name"). A variable the digest covers (a name with one of
    the lookup's prefixes, or one of its whole names) counts by its resolved value, whatever it reads."""
    prefixes, names = digests()[0].get(role, ([role], []))
    covered = tuple(p + "_" for p in prefixes)
    texts = {}
    for path in reachable_task_files(role) + sorted((REPO / "roles" / role / "handlers").rglob("*.yml")):
        texts[path] = without_comments(path.read_text())
    for path in sorted(p for p in (REPO / "roles" / role / "templates").rglob("*") if p.is_file()):
        texts[path] = "\n".join(JINJA.findall(without_comments(path.read_text())))
    for sub in ("vars", "defaults"):
        for path in sorted((REPO / "roles" / role / sub).glob("*.yml")):
            for name, value in (yaml.safe_load(path.read_text()) or {}).items():
                if not (name.startswith(covered) or name in names):
                    texts[Path("%s:%s" % (path, name))] = json.dumps(value)
    return texts


def registered_by(role):
    """The names the role's task files register or set_fact."""
    names = set()
    for path in (REPO / "roles" / role / "tasks").glob("*.yml"):
        for task in _tasks(yaml.safe_load(path.read_text())):
            if isinstance(task.get("register"), str):
                names.add(task["register"])
            facts = task.get("ansible.builtin.set_fact")
            names |= set(facts) if isinstance(facts, dict) else set()
    return names


def other_roles_names(role):
    """Every variable another role defines (defaults, vars) or publishes (set_fact), and the wiring role's names."""
    names = set()
    for other in sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir()):
        folder = REPO / "roles" / other
        for sub in ("defaults", "vars"):
            for path in (folder / sub).glob("*.yml"):
                names |= set((yaml.safe_load(path.read_text()) or {}).keys())
        if other == role:
            continue
        for path in (folder / "tasks").glob("*.yml"):
            for task in _tasks(yaml.safe_load(path.read_text())):
                facts = task.get("ansible.builtin.set_fact") or task.get("set_fact")
                if isinstance(facts, dict):
                    names |= set(facts)
    return {n for n in names if isinstance(n, str)} - {"cacheable"}


def test_apply_skips_some_roles_by_their_digest():
    assert gated_roles(), "playbooks/apply.yml gates no role with raymetal.cluster.role_converges"


# A role grouped all or none (it runs on every node of the play or on none) may read what it registered on the other
# nodes in the same run, and the cluster's host list beside it: map('extract', hostvars, '<its own registered name>').
OWN_EXTRACT = re.compile(r"map\('extract', hostvars, '([a-z_]+)'\)")


@pytest.mark.parametrize("role", gated_roles())
def test_a_skipped_role_reads_only_variables_its_digest_covers(role):
    prefixes = digests()[0].get(role, ([role], []))[0]
    own = tuple(p + "_" for p in prefixes) + tuple("__" + p + "_" for p in prefixes)
    foreign = {n for n in other_roles_names(role) if not n.startswith(own)}
    together = role in digests()[1]
    problems = []
    for path, text in read_by(role).items():
        names = set(NAME.findall(text)) & foreign
        if names:
            problems.append("%s reads %s" % (path.relative_to(REPO), ", ".join(sorted(names))))
        if together and OWN_EXTRACT.search(text) and set(OWN_EXTRACT.findall(text)) <= registered_by(role):
            text = OWN_EXTRACT.sub("", text).replace("groups['ray_cluster']", "")
        for other_host in ("hostvars", "groups["):
            if other_host in text:
                problems.append("%s reads %s" % (path.relative_to(REPO), other_host))
    assert not problems, (
        "playbooks/apply.yml leaves roles/%s alone where the digest of its %s* variables is unchanged, but:\n  %s\n"
        "Fix: hand the value to the role through the wiring role under a %s name (roles/wiring/vars/main.yml), "
        "so that its digest covers it." % (role, role + "_", "\n  ".join(problems), role + "_"))
