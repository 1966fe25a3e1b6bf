"""The deploy's fast path: applied_state (plugins/modules/applied_state.py), the deploy_inputs lookup and the
watch list (playbooks/vars/applied_state.yml)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from module_harness import REPO, ExitJson, run_module

from ansible_collections.raymetal.cluster.plugins.modules import applied_state


def run(args):
    outcome, result = run_module(applied_state, args)
    assert outcome is ExitJson, result
    return result


def node(tmp_path):
    """A node's configuration directory with a file, a link and a subdirectory."""
    conf = tmp_path / "etc" / "ray"
    (conf / "rollback").mkdir(parents=True)
    (conf / "ray.env").write_text("RAY_AUTH_MODE=token\n")
    (conf / "current").symlink_to("ray.env")
    return conf


def test_a_node_without_a_record_is_not_fresh_and_says_so(tmp_path):
    result = run({"path": str(tmp_path / "applied.json"), "inputs": "a-b", "watch": {"paths": [str(tmp_path)]}})
    assert (result["fresh"], result["changed"]) == (False, False)
    assert result["differs"] == ["no record of an earlier deploy on this node"]


def test_record_then_probe_is_fresh_and_returns_the_published_facts(tmp_path):
    conf = node(tmp_path)
    stamp = tmp_path / "state" / "applied.json"
    watch = {"paths": [str(conf), str(tmp_path / "missing")], "kernel_modules": ["surely_not_loaded_module"]}
    # An address of this machine: the probe checks that the node still holds the address it published.
    published = {"ansible_facts": {"fabric": {"address": "127.0.0.1"}}}
    recorded = run({"state": "record", "path": str(stamp), "inputs": "a-b", "watch": watch, "published": published})
    assert recorded["changed"] is True
    assert oct(os.stat(stamp).st_mode & 0o777) == "0o600"
    assert run({"state": "record", "path": str(stamp), "inputs": "a-b", "watch": watch,
                "published": published})["changed"] is False
    probe = run({"path": str(stamp), "inputs": "a-b", "watch": watch})
    assert (probe["fresh"], probe["differs"]) == (True, [])
    assert probe["ansible_facts"] == {"fabric": {"address": "127.0.0.1"}}
    assert probe["recorded_at"] == recorded["recorded_at"]


# 192.0.2.1 (TEST-NET-1, RFC 5737) is on no machine: binding a socket to it sends nothing and fails.
@pytest.mark.parametrize("address, gone", [("127.0.0.1", False), ("127.0.0.1/8", False), ("192.0.2.1", True),
                                           ("192.0.2.1/24", True), ("", False)])
def test_a_node_that_no_longer_holds_its_published_fabric_address_differs(tmp_path, address, gone):
    nonlocal_bind = Path("/proc/sys/net/ipv4/ip_nonlocal_bind")
    if gone and nonlocal_bind.exists() and nonlocal_bind.read_text().strip() != "0":
        pytest.skip("this machine binds sockets to addresses it does not hold (net.ipv4.ip_nonlocal_bind)")
    stamp = tmp_path / "applied.json"
    watch = {"paths": [str(node(tmp_path))]}
    run({"state": "record", "path": str(stamp), "inputs": "a-b", "watch": watch,
         "published": {"ansible_facts": {"fabric": {"address": address}}}})
    probe = run({"path": str(stamp), "inputs": "a-b", "watch": watch})
    line = "fabric address 192.0.2.1: no longer on this node (the last deploy's record has it)"
    assert (probe["fresh"], probe["differs"]) == ((False, [line]) if gone else (True, [])), probe
    assert ("ansible_facts" in probe) is not gone


def test_the_address_check_says_nothing_where_the_node_cannot_tell(monkeypatch):
    class Refused:
        def __init__(self, *args):
            pass

        def bind(self, where):
            raise PermissionError(13, "Permission denied")

        def close(self):
            pass

    monkeypatch.setattr(applied_state.socket, "socket", Refused)
    assert applied_state.address_gone("192.0.2.1") == ""
    assert applied_state.address_gone("fd00::1") == ""
    assert applied_state.address_gone(None) == ""


@pytest.mark.parametrize("drift, expected", [
    (lambda c: (c / "ray.env").write_text("RAY_AUTH_MODE=token\n# by hand\n"), "/ray.env: content"),
    (lambda c: os.chmod(c / "ray.env", 0o666), "/ray.env: type, mode or owner"),
    (lambda c: (c / "extra.conf").write_text("x\n"), "/extra.conf: new (file)"),
    (lambda c: (c / "ray.env").unlink(), "/ray.env: gone"),
    (lambda c: ((c / "current").unlink(), (c / "current").symlink_to("rollback")), "/current: type, mode or owner"),
])
def test_each_kind_of_drift_is_named(tmp_path, drift, expected):
    conf = node(tmp_path)
    stamp = tmp_path / "applied.json"
    watch = {"paths": [str(conf)]}
    run({"state": "record", "path": str(stamp), "inputs": "a-b", "watch": watch})
    drift(conf)
    probe = run({"path": str(stamp), "inputs": "a-b", "watch": watch})
    assert probe["fresh"] is False
    assert "ansible_facts" not in probe
    assert any(line.endswith(expected) or expected in line for line in probe["differs"]), probe["differs"]


def test_changed_inputs_name_the_half_that_changed(tmp_path):
    stamp = tmp_path / "applied.json"
    run({"state": "record", "path": str(stamp), "inputs": "files1-vars1", "watch": {}})
    assert run({"path": str(stamp), "inputs": "files2-vars1", "watch": {}})["differs"] == [
        "raymetal's code or the inventory's files changed since the last deploy"]
    assert run({"path": str(stamp), "inputs": "files1-vars2", "watch": {}})["differs"] == [
        "this host's variables (group and extra variables included) or the inventory's groups changed since the "
        "last deploy"]


def test_the_probe_says_apart_settings_alone_from_code_files_and_watched_state(tmp_path):
    """The full path per role (playbooks/apply.yml) leaves a role alone only where the settings alone changed."""
    conf = node(tmp_path)
    stamp = tmp_path / "applied.json"
    watch = {"paths": [str(conf)]}
    none = run({"path": str(stamp), "inputs": "f1-v1", "watch": watch})
    assert (none["code_same"], none["state_same"]) == (False, False), "no record"
    run({"state": "record", "path": str(stamp), "inputs": "f1-v1", "watch": watch,
         "published": {"raymetal_role_inputs": {"firewall": "d1"}}})
    settings = run({"path": str(stamp), "inputs": "f1-v2", "watch": watch})
    assert (settings["fresh"], settings["code_same"], settings["state_same"]) == (False, True, True)
    assert settings["applied"]["raymetal_role_inputs"] == {"firewall": "d1"}
    code = run({"path": str(stamp), "inputs": "f2-v1", "watch": watch})
    assert (code["code_same"], code["state_same"]) == (False, True)
    (conf / "ray.env").write_text("RAY_AUTH_MODE=none\n")
    drift = run({"path": str(stamp), "inputs": "f1-v2", "watch": watch})
    assert (drift["code_same"], drift["state_same"]) == (True, False)


def test_a_venv_is_watched_by_its_target_and_its_distributions(tmp_path):
    real = tmp_path / "venv-2.60.0"
    site = real / "lib" / "python3.11" / "site-packages"
    (site / "ray-2.60.0.dist-info").mkdir(parents=True)
    link = tmp_path / "venv"
    link.symlink_to(real)
    stamp = tmp_path / "applied.json"
    watch = {"venvs": [str(link)]}
    run({"state": "record", "path": str(stamp), "inputs": "a-b", "watch": watch})
    assert run({"path": str(stamp), "inputs": "a-b", "watch": watch})["fresh"] is True
    (site / "ray-2.60.0.dist-info").rename(site / "ray-2.59.0.dist-info")
    assert run({"path": str(stamp), "inputs": "a-b", "watch": watch})["differs"] == [f"venv {link}: installed distributions"]


def test_an_unreadable_or_foreign_record_is_not_fresh(tmp_path):
    stamp = tmp_path / "applied.json"
    stamp.write_text("{not json")
    assert "unreadable" in run({"path": str(stamp), "inputs": "a", "watch": {}})["differs"][0]
    stamp.write_text(json.dumps({"version": 99}))
    assert "another raymetal version" in run({"path": str(stamp), "inputs": "a", "watch": {}})["differs"][0]


def test_check_mode_writes_no_record(tmp_path):
    stamp = tmp_path / "applied.json"
    run({"state": "record", "path": str(stamp), "inputs": "a", "watch": {}, "_ansible_check_mode": True})
    assert not stamp.exists()


def _ray_name(text):
    """A watch-list entry with the ray role's names filled in as the role defines them (defaults, then its public
    vars): the plays that load the watch list import the ray role, so these are the values a site that sets nothing
    gets."""
    ray = yaml.safe_load((REPO / "roles" / "ray" / "defaults" / "main.yml").read_text())
    ray.update(yaml.safe_load((REPO / "roles" / "ray" / "vars" / "main.yml").read_text()))
    ray["inventory_dir"] = "INVENTORY"
    for _ in range(3):
        text = re.sub(r"\{\{ (\w+) \}\}", lambda m: str(ray[m.group(1)]) if m.group(1) in ray else m.group(0), text)
    return text


def test_the_watch_list_falls_back_to_the_roles_own_defaults():
    """playbooks/vars/applied_state.yml: Ray's names come from the ray role (each play that loads the file imports
    it), never restated; the other roles' fallbacks must be their defaults."""
    text = (REPO / "playbooks" / "vars" / "applied_state.yml").read_text()
    defaults = {}
    for role in ("nccl", "gcs_redis"):
        defaults.update(yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()))
    fallbacks = re.findall(r"(\w+) \| default\('([^']*)'\)", text)
    assert len(fallbacks) >= 1, fallbacks
    assert re.findall(r"ray_\w+ \| default", text) == [], "restates a default of the ray role"
    for name, value in fallbacks:
        if value.startswith("/"):
            assert defaults[name] == value, (name, value, defaults[name])
        else:  # inventory_dir ~ '/credentials/...'
            assert defaults[name].endswith(value), (name, value, defaults[name])
    watched = yaml.safe_load(text)
    assert _ray_name(watched["raymetal_applied_watch"]["venvs"][0]) == "/opt/ray/venv"
    assert _ray_name(watched["raymetal_applied_secret_files"][0]) == "INVENTORY/credentials/ray_auth_token"


def test_every_play_that_loads_the_watch_list_imports_the_ray_role():
    """Ray's names in the watch list resolve only where the play imports the ray role (tasks_from names, or any
    other entry point: import_role exposes the role's defaults and vars to the whole play)."""
    plays = []
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            if "vars/applied_state.yml" in (play.get("vars_files") or []):
                imports = [task.get("ansible.builtin.import_role", {}).get("name") for task in play.get("tasks", [])]
                plays.append((path.name, play["name"], "ray" in imports))
    assert len(plays) >= 3, plays
    assert [p for p in plays if not p[2]] == []


def test_the_watch_list_names_every_unit_the_roles_run():
    """Every unit name in a role's vars (a __*_service/_unit constant, or the ray role's public unit names) is
    watched."""
    watched = yaml.safe_load((REPO / "playbooks" / "vars" / "applied_state.yml").read_text())["raymetal_applied_watch"]
    units = {_ray_name(unit) for unit in watched["units"]}
    assert {"ray-head.service", "ray-worker.service"} <= units
    missing = []
    for vars_file in sorted(Path(REPO / "roles").glob("*/vars/main.yml")):
        for key, value in (yaml.safe_load(vars_file.read_text()) or {}).items():
            if re.search(r"_(service|unit)$", key) and isinstance(value, str) and "{{" not in value:
                names = {value} if "." in value else {value + ".service", value + ".timer"}
                if not names & units:
                    missing.append(f"{vars_file.parent.parent.name}: {key}={value}")
    assert missing == [], missing


def test_the_watch_list_covers_every_configuration_file_the_roles_write():
    """Every configuration file named in a role's vars (a __*_conf constant, an absolute path) lies under a watched
    path: a hand edit there (Redis's requirepass dropped, the wheelhouse nginx opened up) must send the next deploy
    the full way, which puts it back."""
    watched = yaml.safe_load((REPO / "playbooks" / "vars" / "applied_state.yml").read_text())["raymetal_applied_watch"]
    roots = [_ray_name(re.sub(r"\{\{.*?default\('([^']*)'\).*?\}\}", r"\1", path)) for path in watched["paths"]]
    assert "/etc/ray" in roots and "/var/cache/raymetal/wheelhouse" in roots, roots
    unwatched = []
    for vars_file in sorted(Path(REPO / "roles").glob("*/vars/main.yml")):
        for key, value in (yaml.safe_load(vars_file.read_text()) or {}).items():
            if key.endswith("_conf") and isinstance(value, str) and value.startswith("/") and "{{" not in value:
                if not any(value == root or value.startswith(root.rstrip("/") + "/") for root in roots):
                    unwatched.append(f"{vars_file.parent.parent.name}: {key}={value}")
    assert unwatched == [], unwatched


class _HostVars(dict):
    def raw_get(self, host):
        return self[host]


def test_the_inputs_leave_out_the_variables_that_change_nothing_on_a_node():
    """A deploy run with -e raymetal_max_unreachable=1, raymetal_fast_path=false or ansible_timeout=5 has the same
    inputs as one without: which hosts run and how the controller reaches them, not what they get (so a degraded
    deploy keeps the fast path per host)."""
    from ansible_collections.raymetal.cluster.plugins.lookup.deploy_inputs import LookupModule

    def digest(extra):
        hostvars = _HostVars({h: dict({"ray_version": "2.60.0", "group_names": ["ray_cluster"]}, **extra)
                              for h in ("head", "w1")})
        lookup = LookupModule()
        # The options as Ansible's plugin loader would set them from the call (part=vars).
        lookup.set_options = lambda **_: None
        lookup.get_option = {"part": "vars", "extra_files": []}.get
        return lookup.run([["head", "w1"]], variables={"hostvars": hostvars})[0]

    plain = digest({})
    assert digest({"raymetal_max_unreachable": 1}) == plain
    assert digest({"raymetal_max_unreachable": "10%", "raymetal_fast_path": False}) == plain
    # How the controller's SSH connects is no input either (a run that expects a dead host shortens the timeout);
    # where it connects is.
    assert digest({"ansible_timeout": 5, "ansible_control_path_dir": "/tmp/x", "ansible_ssh_retries": 2}) == plain
    assert digest({"ansible_host": "10.0.0.9"}) != plain
    assert digest({"ray_version": "2.59.0"}) != plain


def _lookup(part, per_host=False, extra_files=()):
    from ansible_collections.raymetal.cluster.plugins.lookup.deploy_inputs import LookupModule

    lookup = LookupModule()
    # The options as Ansible's plugin loader would set them from the call.
    lookup.set_options = lambda **_: None
    lookup.get_option = {"part": part, "extra_files": list(extra_files), "per_host": per_host}.get
    return lookup


def _per_host(hostvars):
    return _lookup("vars", per_host=True).run([sorted(hostvars)], variables={"hostvars": _HostVars(hostvars)})[0]


def _cluster(**changes):
    """Three hosts' raw variables as an inventory gives them (group variables repeated on each), with changes
    {host: {variable: value}}."""
    hosts = {"head": ["ray_cluster", "ray_head"], "w1": ["ray_cluster", "ray_worker"], "w2": ["ray_cluster", "ray_worker"]}
    return {h: dict({"ray_version": "2.60.0", "group_names": groups}, **changes.get(h, {})) for h, groups in hosts.items()}


def test_one_host_s_variable_changes_that_host_s_digest_alone():
    """The fast path per host (issue 37): a worker's own setting sends that worker the full path, no other."""
    before = _per_host(_cluster())
    assert sorted(before) == ["head", "w1", "w2"] and len(set(before.values())) == 3
    after = _per_host(_cluster(w1={"ray_labels": {"rack": "r7"}}))
    assert [h for h in before if before[h] != after[h]] == ["w1"]
    # The same digests for the same inputs, run after run.
    assert _per_host(_cluster()) == before


def test_a_group_or_extra_variable_or_a_group_s_members_change_every_host_s_digest():
    before = _per_host(_cluster())
    # A group variable (or an extra variable) reaches every host's variables.
    everywhere = _per_host(_cluster(**{h: {"ray_version": "2.59.0"} for h in ("head", "w1", "w2")}))
    assert all(before[h] != everywhere[h] for h in before)
    # A worker joins the monitoring group: what every other host scrapes and admits changes with it.
    joined = _per_host(_cluster(w2={"group_names": ["ray_cluster", "ray_monitoring", "ray_worker"]}))
    assert all(before[h] != joined[h] for h in before)


def test_the_files_half_leaves_out_the_host_vars_files_of_the_hosts_given(tmp_path):
    """A host_vars file reaches a deploy only as its host's variables (the per-host half); a group_vars file, the
    hosts file or a credentials file changes the files half, for every host."""
    inv = tmp_path / "site"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "group_vars").mkdir()
    (inv / "credentials").mkdir()
    (inv / "hosts.yml").write_text("all: {}\n")
    (inv / "group_vars" / "ray_cluster.yml").write_text("ray_version: 2.60.0\n")
    (inv / "host_vars" / "w1.yml").write_text("ray_labels: {rack: r1}\n")
    (inv / "host_vars" / "outsider.yml").write_text("x: 1\n")
    (inv / "credentials" / "ray_token").write_text("secret\n")

    def files(hosts=("head", "w1", "w2")):
        return _lookup("files").run([list(hosts)], variables={"ansible_inventory_sources": [str(inv)]})[0]

    plain = files()
    (inv / "host_vars" / "w1.yml").write_text("ray_labels: {rack: r7}\n")
    assert files() == plain
    # Without w1 among the hosts given, its file counts as any other inventory file.
    before = files(("head", "w2"))
    (inv / "host_vars" / "w1.yml").write_text("ray_labels: {rack: r9}\n")
    assert files(("head", "w2")) != before and files() == plain
    for path, text in (("host_vars/outsider.yml", "x: 2\n"), ("group_vars/ray_cluster.yml", "ray_version: 2.59.0\n"),
                       ("hosts.yml", "all: {hosts: {w3: {}}}\n"), ("credentials/ray_token", "rotated\n")):
        before = files()
        (inv / path).write_text(text)
        assert files() != before, path


def test_an_inventory_that_links_its_credentials_digests_as_one_that_holds_them(tmp_path):
    """The lab tests' inventory copies link the lab's credentials: the copy's files half is the original's."""
    original = tmp_path / "a" / "lab"
    (original / "credentials").mkdir(parents=True)
    (original / "credentials" / "ray_token").write_text("secret\n")
    (original / "hosts.yml").write_text("all: {}\n")
    copy = tmp_path / "b" / "lab"
    copy.mkdir(parents=True)
    (copy / "hosts.yml").write_text("all: {}\n")
    (copy / "credentials").symlink_to(original / "credentials")

    def files(source):
        # The token as the deploy names it (ray_auth_token_file), one of the files digested by content.
        # A file the deploy would read if it were there (gcs_redis_tls_dir's default) counts as missing, by name.
        return _lookup("files", extra_files=[str(source / "credentials" / "ray_token"),
                                             str(source / "credentials" / "gcs_redis_tls")]).run(
            [["head"]], variables={"ansible_inventory_sources": [str(source)]})[0]

    assert files(copy) == files(original)
    (original / "credentials" / "ray_token").write_text("rotated\n")
    assert files(copy) == files(original)
    # A link back up the tree is walked once, not forever, and adds nothing.
    (copy / "loop").symlink_to(copy)
    assert files(copy) == files(original)
