"""node_files: directories and small files in one module run (plugins/modules/node_files.py)."""

from __future__ import annotations

import grp
import os
import pwd
import stat

import pytest

from module_harness import ExitJson, FailJson, run_module

from ansible_collections.raymetal.cluster.plugins.modules import node_files

OWNER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def run(files, check=False, diff=False, secrets=None):
    args = {"files": files, "secrets": secrets or {}, "_ansible_check_mode": check, "_ansible_diff": diff}
    outcome, result = run_module(node_files, args)
    if outcome is FailJson:
        raise AssertionError(result["msg"])
    assert outcome is ExitJson
    return result


def mode(path):
    return "%04o" % stat.S_IMODE(os.stat(path).st_mode)


def layout(tmp_path):
    conf = tmp_path / "etc" / "ray"
    return [
        {"path": str(conf), "state": "directory", "owner": OWNER, "group": GROUP, "mode": "0750"},
        {"path": str(conf / "ray.env"), "content": "RAY_AUTH_MODE=token\n", "owner": OWNER, "group": GROUP,
         "mode": "0640"},
        {"path": str(conf / "start"), "content": "#!/bin/sh\nexec ray start\n", "mode": "0755"},
    ]


def test_first_run_creates_everything_in_order_and_a_second_changes_nothing(tmp_path):
    files = layout(tmp_path)
    result = run(files)
    assert result["changed"] is True
    assert result["changed_paths"] == result["created"] == [f["path"] for f in files]
    assert (mode(files[0]["path"]), mode(files[1]["path"]), mode(files[2]["path"])) == ("0750", "0640", "0755")
    assert open(files[1]["path"]).read() == "RAY_AUTH_MODE=token\n"
    again = run(files)
    assert (again["changed"], again["changed_paths"], again["created"]) == (False, [], [])


def test_only_the_file_that_differs_is_named_with_its_diff_and_a_secret_has_none(tmp_path):
    files = layout(tmp_path)
    run(files)
    before = os.stat(files[2]["path"]).st_ino
    files[1]["content"] = "RAY_AUTH_MODE=token\nNCCL_DEBUG=WARN\n"
    result = run(files, diff=True)
    assert result["changed_paths"] == [files[1]["path"]]
    assert result["diff"] == [{"before_header": files[1]["path"], "after_header": files[1]["path"],
                               "before": "RAY_AUTH_MODE=token\n", "after": "RAY_AUTH_MODE=token\nNCCL_DEBUG=WARN\n"}]
    assert os.stat(files[2]["path"]).st_ino == before  # untouched
    del files[1]["content"]
    files[1]["secret"] = True
    result = run(files, diff=True, secrets={files[1]["path"]: "token=0123\n"})
    assert result["changed_paths"] == [files[1]["path"]] and result["diff"] == []


def test_a_mode_that_differs_is_set_without_rewriting_the_content(tmp_path):
    files = layout(tmp_path)
    run(files)
    os.chmod(files[1]["path"], 0o644)
    inode = os.stat(files[1]["path"]).st_ino
    result = run(files)
    assert result["changed_paths"] == [files[1]["path"]]
    assert mode(files[1]["path"]) == "0640" and os.stat(files[1]["path"]).st_ino == inode


def test_check_mode_writes_nothing_and_names_what_would_change(tmp_path):
    files = layout(tmp_path)
    result = run(files, check=True, diff=True)
    assert result["changed_paths"] == [f["path"] for f in files]
    assert not os.path.exists(files[0]["path"])
    run(files)
    os.chmod(files[2]["path"], 0o700)
    result = run(files, check=True)
    assert result["changed_paths"] == [files[2]["path"]] and mode(files[2]["path"]) == "0700"


def test_absent_removes_a_file_that_should_no_longer_be_there(tmp_path):
    files = layout(tmp_path)
    run(files)
    gone = {"path": files[2]["path"], "state": "absent"}
    assert run([gone], check=True)["changed_paths"] == [gone["path"]] and os.path.exists(gone["path"])
    assert run([gone])["changed_paths"] == [gone["path"]] and not os.path.exists(gone["path"])
    assert run([gone])["changed"] is False


@pytest.mark.parametrize("entry, message", [
    ({"path": "etc/ray.env", "content": "x"}, "'etc/ray.env' is not an absolute path"),
    ({"path": "/nonexistent-dir-for-test/x"}, "has state=file but no content"),
    ({"path": "/", "content": "x"}, "/ is a directory; a file was asked for"),
    ({"path": "/", "state": "absent"}, "/ is a directory; state=absent removes files only"),
])
def test_bad_entries_fail_with_a_message_that_names_the_path(entry, message):
    outcome, result = run_module(node_files, {"files": [entry]})
    assert outcome is FailJson and message in result["msg"]


def test_a_secret_files_content_is_never_logged_on_the_node_nor_returned(tmp_path):
    """Ansible logs each module run's arguments on the node (the journal): a secret's content must not be in it."""
    from unittest import mock

    from ansible.module_utils import basic

    logged, seen = [], {}
    real_init = basic.AnsibleModule.__init__

    def remember(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        seen["module"] = self

    def log(self, msg, log_args=None):
        logged.append("%s %r" % (msg, log_args))

    key = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJ0123abcd\n-----END PRIVATE KEY-----\n"
    files = [{"path": str(tmp_path / "node.key"), "secret": True, "mode": "0600"},
             {"path": str(tmp_path / "plain"), "content": "shown\n"}]
    secrets = {files[0]["path"]: key}
    with mock.patch.object(basic.AnsibleModule, "__init__", remember), \
            mock.patch.object(basic.AnsibleModule, "log", log):
        result = run(files, diff=True, secrets=secrets)
    assert (tmp_path / "node.key").read_text() == key and result["changed_paths"] == [f["path"] for f in files]
    assert logged and "shown" in " ".join(logged)  # the log was written, with the plain file's content
    assert not [line for line in logged if "MC4CAQAwBQYDK2VwBCIEIJ0123abcd" in line]
    assert key in seen["module"].no_log_values and "shown\n" not in seen["module"].no_log_values
    assert [d["after_header"] for d in result["diff"]] == [files[1]["path"]]
    assert run(files, secrets=secrets)["changed"] is False


def test_a_secret_given_as_content_is_refused(tmp_path):
    """content is logged on the node before the module can act: a file marked secret must use secret_content."""
    entry = {"path": str(tmp_path / "ray.env"), "content": "RAY_REDIS_PASSWORD=0123abcd\n", "secret": True}
    outcome, result = run_module(node_files, {"files": [entry]})
    assert outcome is FailJson and "give it in secrets" in result["msg"] and entry["path"] in result["msg"]
    assert not (tmp_path / "ray.env").exists()
    missing = {"path": str(tmp_path / "x"), "secret": True}
    outcome, result = run_module(node_files, {"files": [missing], "secrets": {"/elsewhere": "b"}})
    assert outcome is FailJson and "a secret file's content is secrets[path]" in result["msg"]


def test_validate_checks_new_content_before_it_replaces_the_file(tmp_path):
    path = tmp_path / "table.nft"
    checker = tmp_path / "check"
    # A stand-in for `nft -c -f %s`: accepts a file without the word BAD.
    checker.write_text("#!/bin/sh\n! grep -q BAD \"$1\"\n")
    checker.chmod(0o755)
    entry = {"path": str(path), "content": "table inet raymetal {}\n", "validate": f"{checker} %s"}
    assert run([entry])["changed_paths"] == [str(path)]
    assert path.read_text() == "table inet raymetal {}\n"
    entry["content"] = "table inet raymetal { BAD }\n"
    args = {"files": [entry], "_ansible_check_mode": False, "_ansible_diff": False}
    outcome, result = run_module(node_files, args)
    assert outcome is FailJson and "failed validation" in result["msg"], result
    # The file kept its content, and no temporary file was left beside it.
    assert path.read_text() == "table inet raymetal {}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["check", "table.nft"]
    # Unchanged content is not validated again; check mode never runs it.
    entry["content"] = "table inet raymetal {}\n"
    entry["validate"] = "/bin/false %s"
    assert run([entry])["changed_paths"] == []
    entry["content"] = "table inet raymetal { x }\n"
    assert run([entry], check=True)["changed_paths"] == [str(path)]
    assert path.read_text() == "table inet raymetal {}\n"


# --- marker: a directory raymetal may remove is one it marked when it made it (issue 35) ---

MARK = ".raymetal-gcs-store"


def test_a_directory_made_with_a_marker_carries_it_and_is_removed_with_everything_in_it(tmp_path):
    store = tmp_path / "gcs"
    entry = {"path": str(store), "state": "directory", "mode": "0700", "marker": MARK}
    assert run([entry])["created"] == [str(store)]
    assert (store / MARK).is_file()
    assert run([entry])["changed"] is False
    (store / "000012.sst").write_text("rocksdb")
    result = run([{"path": str(store), "state": "absent", "marker": MARK}])
    assert result["changed_paths"] == [str(store)] and not store.exists()
    assert run([{"path": str(store), "state": "absent", "marker": MARK}])["changed"] is False


def test_a_directory_of_someone_elses_files_is_never_removed_nor_taken_over(tmp_path):
    home = tmp_path / "home"
    (home / "alice").mkdir(parents=True)
    (home / "alice" / "thesis.tex").write_text("years of work")
    for entry in ({"path": str(home), "state": "absent", "marker": MARK},
                  {"path": str(home), "state": "directory", "owner": "root", "marker": MARK}):
        outcome, result = run_module(node_files, {"files": [entry]})
        assert outcome is FailJson
        assert "not raymetal's marker" in result["msg"] and str(home) in result["msg"]
    assert (home / "alice" / "thesis.tex").read_text() == "years of work"
    assert not (home / MARK).exists()


def test_check_mode_removes_nothing_and_an_empty_unmarked_directory_may_go(tmp_path):
    store = tmp_path / "gcs"
    run([{"path": str(store), "state": "directory", "marker": MARK}])
    assert run([{"path": str(store), "state": "absent", "marker": MARK}], check=True)["changed"] is True
    assert (store / MARK).exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run([{"path": str(empty), "state": "absent", "marker": MARK}])["changed"] is True
    assert not empty.exists()


def test_a_directory_is_never_removed_without_a_marker_option(tmp_path):
    (tmp_path / "d").mkdir()
    outcome, result = run_module(node_files, {"files": [{"path": str(tmp_path / "d"), "state": "absent"}]})
    assert outcome is FailJson and "removes files only" in result["msg"]


def test_a_sticky_mode_is_set_and_then_left_alone(tmp_path):
    entry = {"path": str(tmp_path / "tmp"), "state": "directory", "mode": "1770"}
    assert run([entry])["changed"] is True
    assert "%04o" % stat.S_IMODE(os.stat(entry["path"]).st_mode) == "1770"
    assert run([entry])["changed"] is False
    os.chmod(entry["path"], 0o777)
    assert run([entry])["changed_paths"] == [entry["path"]]
