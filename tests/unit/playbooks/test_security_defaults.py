"""Security defaults that live in configuration rather than in a role."""

from __future__ import annotations

import configparser
import pathlib
import re

import jinja2
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_ansible_checks_ssh_host_keys_by_default():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg.getboolean("defaults", "host_key_checking", fallback=True) is True


def test_only_the_lab_inventory_turns_host_key_checking_off():
    offenders = []
    for path in sorted((ROOT / "inventory").rglob("*.yml")):
        text = path.read_text()
        if "StrictHostKeyChecking=no" in text and "inventory/lab/" not in str(path.relative_to(ROOT)) + "/":
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
    lab = yaml.safe_load((ROOT / "inventory" / "lab" / "group_vars" / "ray_cluster.yml").read_text())
    assert "StrictHostKeyChecking=no" in lab["ansible_ssh_common_args"]


def test_wheelhouse_rsync_checks_host_keys_like_ansible_does():
    for task_file in ("roles/ray/tasks/install-venv.yml",):
        tasks = yaml.safe_load((ROOT / task_file).read_text())
        flat = []
        for task in tasks:
            flat.extend(task.get("block", [task]))
        syncs = [t["ansible.posix.synchronize"] for t in flat if "ansible.posix.synchronize" in t]
        assert syncs, task_file
        for sync in syncs:
            assert sync.get("verify_host") is True and sync.get("use_ssh_args") is True, (task_file, sync)


def _ray_tasks():
    for path in sorted((ROOT / "roles" / "ray" / "tasks").glob("*.yml")):
        for task in yaml.safe_load(path.read_text()) or []:
            for t in task.get("block", [task]):
                yield path.name, t


def test_the_ray_role_removes_the_gcs_store_only_through_its_marker():
    """A directory the user named (ray_gcs_storage_path: /home) is never removed with file: state=absent or find -delete."""
    for name, task in _ray_tasks():
        text = yaml.safe_dump(task)
        if "ray_gcs_storage_path" in text or "__ray_gcs_store_renew" in text:
            assert "ansible.builtin.file" not in task and "-delete" not in text, (name, task["name"])
    rvars = yaml.safe_load((ROOT / "roles" / "ray" / "vars" / "main.yml").read_text())
    for entry in rvars["__ray_gcs_store_renew"]:
        assert entry["marker"] == "{{ __ray_gcs_store_marker }}"
    assert {"ray_gcs_storage_path", "ray_state_dir", "ray_temp_dir", "ray_config_dir", "ray_venv_path",
            "ray_wheelhouse_dir"} <= set(rvars["__ray_removed_dirs"])
    for task_file in ("preflight.yml", "teardown.yml"):
        assert "__ray_removed_dirs | raymetal.cluster.removal_path_problems" in (
            ROOT / "roles" / "ray" / "tasks" / task_file).read_text(), task_file


def test_teardowns_remove_a_file_setting_only_as_a_file():
    """nccl_conf_path: /etc or acceptance_state_file: /home would have removed a tree with file: state=absent."""
    for role, var in (("nccl", "nccl_conf_path"), ("acceptance", "acceptance_state_file")):
        tasks = yaml.safe_load((ROOT / "roles" / role / "tasks" / "teardown.yml").read_text())
        for task in tasks:
            if "{{ %s }}" % var in yaml.safe_dump(task):
                assert "ansible.builtin.file" not in task, (role, task["name"])


def test_ray_temp_dir_is_sticky_closed_to_others_and_owned_by_root_so_ray_cannot_reopen_it():
    """Was ray:ray 0777 (issue 35): anyone could remove or replace Ray's session directories. Ray 2.60 chmods a temp
    dir it owns back to 0777 at every start, so the owner must be root (and the mode then stays: idempotent)."""
    tasks = yaml.safe_load((ROOT / "roles" / "ray" / "tasks" / "configure.yml").read_text())
    dirs = next(t for t in tasks if "raymetal.cluster.node_files" in t)["vars"]["__ray_config_dirs"]
    temp = next(d for d in dirs if d["path"] == "{{ ray_temp_dir }}")
    assert (temp["owner"], temp["group"], temp["mode"]) == ("root", "{{ ray_group }}", "1770")
    mode = int(temp["mode"], 8)
    assert mode & 0o1000 and not mode & 0o007


SECRET_NAME = re.compile(r"(password|token|secret)$")


def test_every_secret_variable_is_no_log_in_its_argument_spec():
    """ray_auth_token had no no_log (issue 35): a failed validation printed it."""
    secrets = []
    for spec_path in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        spec = yaml.safe_load(spec_path.read_text())["argument_specs"]
        for entry_point in spec.values():
            for name, option in (entry_point.get("options") or {}).items():
                if SECRET_NAME.search(name):
                    secrets.append(name)
                    assert option.get("no_log") is True, (spec_path.parent.parent.name, name)
    assert "ray_auth_token" in secrets and "monitoring_grafana_admin_password" in secrets


def _render(path, **values):
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    return env.from_string((ROOT / path).read_text()).render(values)


def test_redis_admits_the_head_by_its_certificate_and_no_password_reaches_a_command_line():
    """Ray put Redis's password on the command line of the GCS, the raylet and every worker of the head (issue 35):
    Redis now takes TLS client certificates, and neither the unit nor ray.env carries a password."""
    conf = _render("roles/gcs_redis/templates/raymetal-gcs.conf.j2", ansible_managed="m", gcs_redis_bind_address="10.1.0.3",
                   gcs_redis_port=6390, __gcs_redis_tls_dir="/etc/redis/raymetal-gcs-tls", gcs_redis_appendfsync="everysec",
                   __gcs_redis_data_dir="/var/lib/redis", gcs_redis_maxmemory=0)
    lines = [line for line in conf.splitlines() if line and not line.startswith("#")]
    assert "port 0" in lines and "tls-port 6390" in lines and "tls-auth-clients yes" in lines
    # Protected mode is off only because a client certificate is required (it refuses every non-loopback client
    # of a Redis without a password).
    assert "protected-mode no" in lines and "bind 10.1.0.3" in lines
    assert "tls-ca-cert-file /etc/redis/raymetal-gcs-tls/ca.crt" in lines
    assert not [line for line in lines if line.startswith(("requirepass", "masterauth"))], lines
    unit = (ROOT / "roles" / "ray" / "templates" / "ray.service.j2").read_text()
    assert "redis-password" not in unit and "REDIS_PASSWORD" not in unit
    env = (ROOT / "roles" / "ray" / "templates" / "ray.env.j2").read_text()
    assert "RAY_REDIS_PASSWORD" not in env
    assert "RAY_REDIS_ADDRESS=rediss://{{ ray_gcs_redis_address }}" in env
    for name in ("RAY_REDIS_CA_CERT", "RAY_REDIS_CLIENT_CERT", "RAY_REDIS_CLIENT_KEY"):
        assert f"{name}={{{{ __ray_redis_" in env, name


def test_ray_env_and_the_token_never_show_in_a_diff():
    """ray.env was secret only while Redis was on: the run that turned it off printed the password as the old content."""
    tasks = yaml.safe_load((ROOT / "roles" / "ray" / "tasks" / "configure.yml").read_text())
    files = next(t for t in tasks if "raymetal.cluster.node_files" in t)["vars"]["__ray_config_files"]
    env = next(f for f in files if f["path"] == "{{ ray_config_dir }}/ray.env")
    assert env["secret"] is True and "content" not in env
    # The token is written by the same task, as a secret: never logged on the node, in a diff or returned.
    token = next(f for f in files if f["path"] == "{{ ray_auth_token_path }}")
    assert token["secret"] is True and "content" not in token and token["mode"] == "0600"
    task = next(t for t in tasks if "raymetal.cluster.node_files" in t)
    assert "ray_auth_token_path: __ray_token_content" in task["raymetal.cluster.node_files"]["secrets"]
    assert task["vars"]["__ray_token_content"] == "{{ __ray_auth_token }}\n"


def test_no_private_key_or_secret_file_reaches_the_nodes_journal():
    """Ansible logs a module's arguments on the node: the TLS keys and ray.env were in every node's journal.

    node_files takes a secret file's content in its no_log option secrets (by path), never as content.
    """
    import re

    found = 0
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        for task in yaml.safe_load(path.read_text()) or []:
            if "raymetal.cluster.node_files" not in task:
                continue
            found += 1
            text = yaml.safe_dump(task, width=10000)
            # A key file's content given as content (the key's lookup on a content line).
            leaks = [line for line in text.splitlines() if "content" in line and re.search(r"\.key\b|/server\.key", line)
                     and "secrets" not in line]
            assert not leaks, f"{path.relative_to(ROOT)}: a key's content given as content: {leaks}"
            if "secret" in text:
                assert "secrets" in task["raymetal.cluster.node_files"], f"{path.relative_to(ROOT)}: {task['name']}"
    assert found >= 5
    configure = yaml.safe_load((ROOT / "roles" / "ray" / "tasks" / "configure.yml").read_text())
    task = next(t for t in configure if "raymetal.cluster.node_files" in t)
    for key in ("__ray_tls_key", "__ray_redis_tls_key", "ray.env"):
        assert key in task["raymetal.cluster.node_files"]["secrets"], key


def test_redis_config_is_roots_and_config_rewrite_cannot_persist():
    """Was redis:redis 0640 (issue 35): CONFIG SET requirepass "" + CONFIG REWRITE survived a restart."""
    # main.yml includes run.yml on the Redis host.
    main = yaml.safe_load((ROOT / "roles" / "gcs_redis" / "tasks" / "main.yml").read_text())
    assert any(t.get("ansible.builtin.include_tasks") == "run.yml" for t in main)
    tasks = yaml.safe_load((ROOT / "roles" / "gcs_redis" / "tasks" / "run.yml").read_text())
    files = next(t for t in tasks if "raymetal.cluster.node_files" in t)["raymetal.cluster.node_files"]["files"]
    conf = next(f for f in files if f["path"] == "{{ __gcs_redis_conf }}")
    assert (conf["owner"], conf["group"], conf["mode"], conf["secret"]) == ("root", "redis", "0640", True)
    assert "content" not in conf
    template = (ROOT / "roles" / "gcs_redis" / "templates" / "raymetal-gcs.conf.j2").read_text()
    assert 'rename-command CONFIG ""' in template.splitlines()


def _assert_holds(task, **variables):
    import jinja2
    env = jinja2.Environment()
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("true", "yes", "1", "on")
    env.tests["match"] = lambda value, pattern: re.match(pattern, value) is not None
    return all(env.compile_expression(cond)(**variables) for cond in task["ansible.builtin.assert"]["that"])


def test_an_unsigned_apt_mirror_needs_an_explicit_acknowledgement():
    """package_mirror_apt_trusted: true was accepted anywhere (issue 35): unsigned packages installed as root."""
    tasks = yaml.safe_load((ROOT / "roles" / "package_mirror" / "tasks" / "main.yml").read_text())
    check = next(t for t in tasks if "acknowledges" in t["name"])
    site = {"package_mirror_apt_url": "http://mirror.example.org/", "package_mirror_apt_trusted": True,
            "package_mirror_apt_trusted_acknowledged": False, "package_mirror_apt_key_src": "",
            "ansible_facts": {"os_family": "Debian"}, "inventory_hostname": "n1"}
    assert not _assert_holds(check, **site)
    # The message names the unsigned mirror and the acknowledgement that lets it through.
    env = jinja2.Environment()
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("true", "yes", "1", "on")
    env.tests["match"] = lambda value, pattern: re.match(pattern, value) is not None
    said = env.from_string(check["ansible.builtin.assert"]["fail_msg"]).render(**site)
    assert "without checking any signature" in said and "package_mirror_apt_trusted_acknowledged: true" in said
    assert _assert_holds(check, **dict(site, package_mirror_apt_trusted_acknowledged=True))
    assert _assert_holds(check, **dict(site, package_mirror_apt_trusted=False, package_mirror_apt_key_src="/keys/mirror.gpg"))
    assert _assert_holds(check, **dict(site, package_mirror_apt_url=""))
    defaults = yaml.safe_load((ROOT / "roles" / "package_mirror" / "defaults" / "main.yml").read_text())
    assert defaults["package_mirror_apt_trusted_acknowledged"] is False
    lab = yaml.safe_load((ROOT / "inventory" / "lab" / "group_vars" / "ray_cluster.yml").read_text())
    assert lab["package_mirror_apt_trusted"] is True and lab["package_mirror_apt_trusted_acknowledged"] is True
