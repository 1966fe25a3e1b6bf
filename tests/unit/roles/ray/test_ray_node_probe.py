"""roles/ray/files/ray_node_probe.py: what preflight reads from a node in one round trip."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

PROBE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "roles", "ray", "files", "ray_node_probe.py")
spec = importlib.util.spec_from_file_location("ray_node_probe", PROBE)
probe_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe_mod)


def fake_venv(tmp_path, script):
    """A venv whose bin/python prints `script`'s output, as a real venv's interpreter would."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\n" + script + "\n")
    python.chmod(0o755)
    return str(venv)


def test_missing_venv_reports_none_and_no_stamp(tmp_path):
    found = probe_mod.probe(str(tmp_path / "nope"), str(tmp_path / "a" / "b" / "tmp"), str(tmp_path / "stamp.json"))
    assert found["ray"] == "none" and found["python"] == "none"
    assert found["stamp"] is None
    assert found["shm_bytes"] > 0 and found["temp_free_mb"] > 0
    assert "wheels" not in found


def test_versions_come_from_the_venv_interpreter(tmp_path):
    venv = fake_venv(tmp_path, """echo '{"ray": "2.60.0", "python": "3.11.2"}'""")
    found = probe_mod.probe(venv, str(tmp_path), str(tmp_path / "stamp.json"))
    assert (found["ray"], found["python"]) == ("2.60.0", "3.11.2")


def test_a_broken_venv_interpreter_counts_as_no_ray(tmp_path):
    venv = fake_venv(tmp_path, "echo boom >&2; exit 3")
    assert probe_mod.probe(venv, str(tmp_path), str(tmp_path / "s"))["ray"] == "none"


def test_real_interpreter_without_ray(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(sys.executable, str(venv / "bin" / "python"))
    found = probe_mod.venv_versions(str(venv))
    assert found["ray"] == "none"
    assert found["python"] == sys.version.split()[0]


def test_stamp_and_wheels(tmp_path):
    stamp = tmp_path / "stamp.json"
    stamp.write_text(json.dumps({"requirement": "ray[default]==2.60.0", "wheels": ["a.whl"]}))
    wheels = tmp_path / "wh"
    wheels.mkdir()
    for name in ("b-1.whl", "a-1.whl", ".complete-x"):
        (wheels / name).write_text("")
    (wheels / "subdir").mkdir()
    found = probe_mod.probe(str(tmp_path / "nope"), str(tmp_path), str(stamp), str(wheels))
    assert found["stamp"]["requirement"] == "ray[default]==2.60.0"
    assert found["wheels"] == ["a-1.whl", "b-1.whl"]


def test_link_reports_what_the_stable_venv_path_is(tmp_path):
    target = tmp_path / "venv-2.60.0"
    target.mkdir()
    link = tmp_path / "venv"
    assert probe_mod.probe(str(target), str(tmp_path), str(tmp_path / "s"), "", "", str(link))["link"] is None
    link.symlink_to(target)
    assert probe_mod.probe(str(target), str(tmp_path), str(tmp_path / "s"), "", "", str(link))["link"] == str(target)
    link.unlink()
    link.mkdir()
    assert probe_mod.describe_link(str(link)) == "directory"
    link.rmdir()
    link.write_text("")
    assert probe_mod.describe_link(str(link)) == "other"
    assert "link" not in probe_mod.probe(str(target), str(tmp_path), str(tmp_path / "s"))


def test_unreadable_stamp_is_no_stamp(tmp_path):
    stamp = tmp_path / "stamp.json"
    stamp.write_text("{not json")
    assert probe_mod.read_stamp(str(stamp)) is None


def test_temp_dir_space_is_measured_on_the_nearest_existing_parent(tmp_path):
    assert probe_mod.existing_parent(str(tmp_path / "x" / "y")) == str(tmp_path)


@pytest.mark.parametrize("args", [[], ["a", "b"], ["a", "b", "c", "d", "e", "f", "g", "h", "i"]])
def test_wrong_arguments_print_usage_and_exit_2(args):
    proc = subprocess.run([sys.executable, PROBE] + args, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "ray_node_probe.py VENV TEMP_DIR STAMP_FILE" in proc.stderr


def test_runs_as_a_script_and_prints_one_json_object(tmp_path):
    proc = subprocess.run([sys.executable, PROBE, str(tmp_path / "v"), str(tmp_path), str(tmp_path / "s"), ""],
                          capture_output=True, text=True, check=True)
    found = json.loads(proc.stdout)
    assert found["ray"] == "none" and "wheels" not in found


def test_a_restart_marker_is_reported_with_its_reason(tmp_path):
    marker = tmp_path / ".restart-pending"
    found = probe_mod.probe(str(tmp_path / "nope"), str(tmp_path), str(tmp_path / "s.json"), "", str(marker))
    assert found["restart_pending"] is None
    marker.write_text("token, environment\n")
    found = probe_mod.probe(str(tmp_path / "nope"), str(tmp_path), str(tmp_path / "s.json"), "", str(marker))
    assert found["restart_pending"] == "token, environment"
    marker.write_text("")
    found = probe_mod.probe(str(tmp_path / "nope"), str(tmp_path), str(tmp_path / "s.json"), "", str(marker))
    assert found["restart_pending"]  # an empty marker still means a restart is owed


def test_the_interpreter_that_runs_the_probe_is_reported_before_any_venv_exists(tmp_path):
    # The wheels a node gets are chosen by this Python (ray_python), not by the venv's, which may not exist yet.
    found = probe_mod.probe(str(tmp_path / "nope"), str(tmp_path), str(tmp_path / "s"))
    assert found["python"] == "none"
    assert found["interpreter"]["version"] == "%d.%d.%d" % sys.version_info[:3]
    assert found["interpreter"]["machine"] == os.uname().machine
    assert found["interpreter"]["glibc"].startswith("2.")


def test_units_report_enabled_and_active_as_systemctl_prints_them(tmp_path, monkeypatch):
    # A stand-in systemctl: is-enabled and is-active print one line per unit, in order, as systemd's does.
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n"
                    "case $1 in is-enabled) printf 'enabled\\nnot-found\\n' ;; is-active) printf 'active\\ninactive\\n' ;; esac\n"
                    "exit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake.parent, os.environ["PATH"]))
    found = probe_mod.probe(str(tmp_path / "nope"), str(tmp_path), str(tmp_path / "s"), "", "", "",
                            "ray-prune-sessions.timer,gone.service")
    assert found["units"] == {"ray-prune-sessions.timer": "enabled/active", "gone.service": "not-found/inactive"}
    # Without UNITS there is no such key; an answer that does not fit is "unknown", never a guess.
    assert "units" not in probe_mod.probe(str(tmp_path / "nope"), str(tmp_path), str(tmp_path / "s"))
    fake.write_text("#!/bin/sh\necho enabled\n")
    assert probe_mod.unit_states(["a.timer", "b.service"]) == {"a.timer": "unknown/unknown",
                                                                "b.service": "unknown/unknown"}


def test_account_reports_the_user_and_group_entries_or_none():
    import grp
    import pwd
    me = pwd.getpwuid(os.getuid())
    group = grp.getgrgid(os.getgid()).gr_name
    found = probe_mod.account_facts("%s:%s" % (me.pw_name, group))
    assert found["user"] == {"name": me.pw_name, "uid": me.pw_uid, "group": grp.getgrgid(me.pw_gid).gr_name,
                             "home": me.pw_dir, "shell": me.pw_shell, "comment": me.pw_gecos}
    assert found["group"] == {"name": group, "gid": os.getgid()}
    assert probe_mod.account_facts("no-such-user-raymetal:no-such-group-raymetal") == {"user": None, "group": None}
