"""Unit tests for raymetal_shared_storage: its validation and settings (plugins/filter/shared_storage.py), the
acceptance probe (roles/acceptance/files/storage_probe.py) on real directories, and the verdicts it feeds
(plugins/filter/acceptance.py storage_items and the report's per-node storage entry)."""

from __future__ import annotations

import json
import pathlib
import os
import subprocess
import sys

import pytest

from ansible_collections.raymetal.cluster.plugins.filter import acceptance as acc
from ansible_collections.raymetal.cluster.plugins.filter import shared_storage as ss

ROOT = pathlib.Path(__file__).resolve().parents[4]
PROBE = ROOT / "roles" / "acceptance" / "files" / "storage_probe.py"

NFS = {"kind": "mount", "source": "nfs01:/export/ray", "fstype": "nfs", "options": "vers=4.2,hard"}


@pytest.mark.parametrize("value", [None, "", {}, {"kind": "none"}, NFS,
                                   {"kind": "mount", "source": "/srv/lab-shared", "fstype": "none",
                                    "options": "bind", "path": "/data/ray_ckpt"}])
def test_valid_settings_have_no_problems(value):
    assert ss.shared_storage_problems(value) == []


@pytest.mark.parametrize("value, words", [
    ("nfs01:/x", ["must be a dict"]),
    ({"kind": "nfs"}, ["kind='nfs' is not one of none, mount, s3"]),
    ({"kind": "mount", "fstype": "nfs"}, ["raymetal_shared_storage.source is empty", "Fix: set source"]),
    ({"kind": "mount", "source": "a:/b"}, ["raymetal_shared_storage.fstype is empty"]),
    (dict(NFS, path="/etc/ray"), ["is a system directory"]),
    (dict(NFS, path="/mnt"), ["is a system directory"]),
    (dict(NFS, path="relative/dir"), ["is not an absolute path"]),
    (dict(NFS, path="/mnt/a b"), ["is not an absolute path"]),
    (dict(NFS, path="/mnt/../etc"), ["is not an absolute path"]),
    (dict(NFS, options="vers=4.2, hard"), ["contains whitespace"]),
    (dict(NFS, packages="nfs-common"), ["is not a list of package names"]),
    (dict(NFS, server="x"), ["unknown key(s) server"]),
])
def test_problems_name_the_variable_and_the_fix(value, words):
    problems = ss.shared_storage_problems(value)
    assert problems, value
    text = " | ".join(problems)
    assert "raymetal_shared_storage" in text and "Fix:" in text
    for word in words:
        assert word in text, (word, text)


def test_settings_fill_in_the_defaults_and_name_the_mount_unit():
    none = ss.shared_storage_settings(None)
    assert none["kind"] == "none" and none["unit"] == "" and none["ray_path"] == ""
    nfs = ss.shared_storage_settings(NFS)
    assert nfs == {"kind": "mount", "source": "nfs01:/export/ray", "fstype": "nfs", "options": "vers=4.2,hard",
                   "path": "/mnt/ray-shared", "packages": ["nfs-common"], "unit": "mnt-ray\\x2dshared.mount",
                   "ray_path": "/mnt/ray-shared", "s3": {}}
    lustre = ss.shared_storage_settings({"kind": "mount", "source": "mgs@o2ib:/scratch", "fstype": "lustre",
                                         "path": "/lustre/scratch/ray/", "packages": ["lustre-client-modules"]})
    assert lustre["packages"] == ["lustre-client-modules"] and lustre["options"] == "defaults"
    assert lustre["path"] == "/lustre/scratch/ray" and lustre["unit"] == "lustre-scratch-ray.mount"


@pytest.mark.parametrize("value", [{"kind": "s3"}, {"kind": "s3", "host": "w1", "bucket": "ckpt.team-a", "port": 9000,
                                                   "data_dir": "/data/s3", "size_gb": 500}])
def test_valid_s3_settings_have_no_problems(value):
    assert ss.shared_storage_problems(value, ["head", "w1"]) == []


@pytest.mark.parametrize("value, words", [
    ({"kind": "s3", "host": "w9"}, ["host='w9' is not a host of ray_cluster", "head, w1"]),
    ({"kind": "s3", "bucket": "Ray_Ckpt"}, ["bucket='Ray_Ckpt' is not an S3 bucket name"]),
    ({"kind": "s3", "bucket": "10.0.0.1"}, ["is not an S3 bucket name"]),
    ({"kind": "s3", "port": 80}, ["port=80 is not a port from 1024 to 65527", "worker ports"]),
    ({"kind": "s3", "port": "8333"}, ["port='8333'"]),
    ({"kind": "s3", "size_gb": 0}, ["size_gb=0 is not a whole number"]),
    ({"kind": "s3", "size_gb": True}, ["size_gb=True"]),
    ({"kind": "s3", "data_dir": "/var/lib"}, ["data_dir=/var/lib is a system directory"]),
    ({"kind": "s3", "data_dir": "s3data"}, ["data_dir='s3data' is not an absolute path"]),
    # The mount kind's keys are not kind s3's (and the other way round).
    ({"kind": "s3", "source": "x"}, ["unknown key(s) source for kind s3"]),
    (dict(NFS, bucket="ray"), ["unknown key(s) bucket for kind mount"]),
])
def test_s3_problems_name_the_key_and_the_fix(value, words):
    text = " | ".join(ss.shared_storage_problems(value, ["head", "w1"]))
    assert "raymetal_shared_storage" in text and "Fix:" in text, value
    for word in words:
        assert word in text, (word, text)


def test_s3_settings_default_to_the_head_and_size_the_store():
    s3 = ss.shared_storage_settings({"kind": "s3"}, "head")
    assert s3["kind"] == "s3" and s3["ray_path"] == "s3://ray" and s3["path"] == "" and s3["unit"] == ""
    assert s3["s3"] == {"host": "head", "bucket": "ray", "port": 8333, "data_dir": "/var/lib/raymetal-s3",
                        "size_gb": 100, "volumes": 100, "volume_size_mb": 1024,
                        "limit_bytes": 100 * 1024 ** 3, "metrics_port": 8341}
    other = ss.shared_storage_settings({"kind": "s3", "host": "w1", "bucket": "ckpt", "size_gb": 3,
                                        "data_dir": "/data/s3/"}, "head")
    assert other["ray_path"] == "s3://ckpt" and other["s3"]["host"] == "w1" and other["s3"]["volumes"] == 3
    assert other["s3"]["data_dir"] == "/data/s3"
    assert ss.shared_storage_settings(NFS, "head")["s3"] == {}


@pytest.mark.parametrize("path", ["/mnt/ray-shared", "/data/a-b/c_d.e", "/lustre/x"])
def test_mount_unit_name_is_systemd_escape(path):
    try:
        out = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no systemd-escape on this machine")
    assert ss.mount_unit_name(path) == out


def probe(*args):
    out = subprocess.run([sys.executable, "-", *args], input=PROBE.read_text(), capture_output=True, text=True,
                         check=True).stdout
    return out, json.loads(out)


def run(phase, directory, *args):
    return probe(phase, "--dir", str(directory), "--run", "r1", *args)


def registered(out):
    return {"rc": 0, "stdout": out, "stderr": ""}


def test_probe_on_one_shared_directory_passes(tmp_path):
    hosts = "head,worker1"
    w_head, head = run("write", tmp_path, "--host", "head", "--mib", "2")
    w_w1, w1 = run("write", tmp_path, "--host", "worker1", "--mib", "2")
    assert head["bytes"] == 2 << 20 and head["write_mb_per_s"] > 0 and head["sha256"] != w1["sha256"]
    r_head, read = run("read", tmp_path, "--peer", "worker1", "--expect", w1["sha256"], "--hosts", hosts)
    assert read["digest_ok"] is True and read["missing"] == [] and "error" not in read and read["read_mb_per_s"] > 0
    items = acc.storage_items([registered(w_head), registered(r_head)], "head", "worker1", "/mnt/ray-shared", 0.001)
    assert items[0]["error"] is None and items[0]["write_mb_per_s"] == head["write_mb_per_s"]
    for host in ("head", "worker1"):
        run("clean", tmp_path, "--host", host)
    assert not (tmp_path / ".raymetal-acceptance").exists()


def test_probe_on_a_local_directory_per_node_fails_and_says_why(tmp_path):
    # Two nodes, each with its own local directory: the peer's file is never there.
    mine, theirs = tmp_path / "head", tmp_path / "worker1"
    mine.mkdir(), theirs.mkdir()
    run("write", mine, "--host", "head", "--mib", "1")
    _, w1 = run("write", theirs, "--host", "worker1", "--mib", "1")
    out, read = run("read", mine, "--peer", "worker1", "--expect", w1["sha256"], "--hosts", "head,worker1")
    assert read["missing"] == ["worker1"] and "not one filesystem shared by the nodes" in read["error"]
    w_out, _ = run("write", mine, "--host", "head", "--mib", "1")
    item = acc.storage_items([registered(w_out), registered(out)], "head", "worker1", str(mine), 20)[0]
    assert "not one filesystem" in item["error"]
    report = acc.acceptance_report({"head": {"versions": {}}}, traffic=[item])
    assert report["nodes"]["head"]["verdict"] == "FAIL"
    assert report["nodes"]["head"]["storage"]["error"] == item["error"]
    assert "storage: worker1's file is not here" in report["lines"][0]


def test_probe_finds_changed_data(tmp_path):
    _, w1 = run("write", tmp_path, "--host", "worker1", "--mib", "1")
    path = tmp_path / ".raymetal-acceptance" / "r1" / "worker1.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    _, read = run("read", tmp_path, "--peer", "worker1", "--expect", w1["sha256"], "--hosts", "worker1")
    assert read["digest_ok"] is False and "reads back different" in read["error"]


def test_probe_that_cannot_write_names_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    out, result = run("write", blocker, "--host", "head", "--mib", "1")
    assert "cannot write" in result["error"] and str(blocker) in result["error"]
    item = acc.storage_items([registered(out), {"skipped": True}], "head", "", str(blocker), 20)[0]
    assert item["error"].startswith("cannot write")


# Kind s3: the probe goes through pyarrow.fs from Ray's venv. The controller's venv has no pyarrow, so these tests give
# the probe a stand-in package with the same calls (FileSystem.from_uri, get_file_info, FileSelector, FileType,
# open_output_stream, open_input_stream, delete_file, delete_dir) over a local directory, which also records the
# endpoint the probe found; the lab's kind s3 test runs the real one against SeaweedFS.
FAKE_PYARROW_FS = """
import enum, os
class FileType(enum.IntEnum):
    NotFound = 0
    File = 1
    Directory = 2
class FileSelector:
    def __init__(self, base_dir, allow_not_found=False, recursive=False):
        self.base_dir, self.allow_not_found = base_dir, allow_not_found
class FileInfo:
    def __init__(self, path, type):
        self.path, self.type, self.base_name = path, type, path.rstrip("/").rsplit("/", 1)[-1]
class _Local:
    def __init__(self, root):
        self.root = root
    def _p(self, path):
        return os.path.join(self.root, path)
    def get_file_info(self, what):
        if isinstance(what, FileSelector):
            base = self._p(what.base_dir)
            if not os.path.isdir(base):
                return []
            return [self.get_file_info(what.base_dir + "/" + n) for n in sorted(os.listdir(base))]
        p = self._p(what)
        return FileInfo(what, FileType.Directory if os.path.isdir(p) else FileType.File if os.path.exists(p) else FileType.NotFound)
    def open_output_stream(self, path):
        os.makedirs(os.path.dirname(self._p(path)), exist_ok=True)
        return open(self._p(path), "wb")
    def open_input_stream(self, path):
        return open(self._p(path), "rb")
    def delete_file(self, path):
        os.unlink(self._p(path))
    def delete_dir(self, path):
        os.rmdir(self._p(path))
class FileSystem:
    @staticmethod
    def from_uri(uri):
        assert uri.startswith("s3://")
        with open(os.environ["FAKE_S3_SEEN"], "a") as seen:
            seen.write(os.environ.get("AWS_ENDPOINT_URL", "") + " " + os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "") + "\\n")
        return _Local(os.environ["FAKE_S3_ROOT"]), uri[len("s3://"):]
"""


def s3_probe(tmp_path, *args, pyarrow=True):
    (tmp_path / "site" / "pyarrow").mkdir(parents=True, exist_ok=True)
    if pyarrow:
        (tmp_path / "site" / "pyarrow" / "__init__.py").write_text("")
        (tmp_path / "site" / "pyarrow" / "fs.py").write_text(FAKE_PYARROW_FS)
    (tmp_path / "store" / "ray").mkdir(parents=True, exist_ok=True)
    env_file = tmp_path / "ray.env"
    env_file.write_text("RAY_TMPDIR=/var/lib/ray/tmp\nAWS_ENDPOINT_URL=http://10.0.0.1:8333\n"
                        "AWS_SHARED_CREDENTIALS_FILE=/etc/ray/storage-s3-credentials\nAWS_EC2_METADATA_DISABLED=true\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), FAKE_S3_ROOT=str(tmp_path / "store"),
               FAKE_S3_SEEN=str(tmp_path / "seen"))
    out = subprocess.run([sys.executable, "-", args[0], "--dir", "s3://ray", "--run", "r1", "--env-file", str(env_file),
                          *args[1:]], input=PROBE.read_text(), capture_output=True, text=True, check=True, env=env).stdout
    return out, json.loads(out)


def test_probe_on_an_s3_bucket_writes_reads_and_removes_objects_with_ray_s_endpoint(tmp_path):
    _, head = s3_probe(tmp_path, "write", "--host", "head", "--mib", "2")
    _, w1 = s3_probe(tmp_path, "write", "--host", "worker1", "--mib", "2")
    assert head["bytes"] == 2 << 20 and head["write_mb_per_s"] > 0 and "error" not in w1
    assert (tmp_path / "store" / "ray" / ".raymetal-acceptance" / "r1" / "worker1.bin").stat().st_size == 2 << 20
    out, read = s3_probe(tmp_path, "read", "--peer", "worker1", "--expect", w1["sha256"], "--hosts", "head,worker1")
    assert read["digest_ok"] is True and read["missing"] == [] and "error" not in read, read
    # The endpoint and the key file's path came from Ray's environment file, as every Ray process gets them.
    assert set((tmp_path / "seen").read_text().splitlines()) == {"http://10.0.0.1:8333 /etc/ray/storage-s3-credentials"}
    item = acc.storage_items([registered(out), registered(out)], "head", "worker1", "s3://ray", 0.001)[0]
    assert item["path"] == "s3://ray"
    for host in ("head", "worker1"):
        assert s3_probe(tmp_path, "clean", "--host", host)[1] == {"cleaned": True}
    assert list((tmp_path / "store" / "ray").iterdir()) == []


def test_probe_on_an_s3_bucket_names_a_missing_object_and_a_missing_pyarrow(tmp_path):
    _, read = s3_probe(tmp_path, "read", "--peer", "worker1", "--expect", "x", "--hosts", "head,worker1")
    assert read["missing"] == ["head", "worker1"] and "worker1's file is not here" in read["error"], read
    bare = tmp_path / "bare"
    bare.mkdir()
    for phase in (["write", "--host", "head", "--mib", "1"], ["read", "--peer", "head", "--hosts", "head"],
                  ["clean", "--host", "head"]):
        _, result = s3_probe(bare, *phase, pyarrow=False)
        assert "pyarrow is not in Ray's venv" in result["error"] and "ray_pip_extras" in result["error"], result


def test_storage_below_the_floor_fails_and_the_report_carries_the_figures():
    write = registered(json.dumps({"write_mb_per_s": 5.0, "sha256": "x", "bytes": 1}))
    read = registered(json.dumps({"read_mb_per_s": 300.0, "digest_ok": True, "missing": [], "peer": "worker1"}))
    item = acc.storage_items([write, read], "head", "worker1", "/mnt/ray-shared", 20)[0]
    assert item["error"] is None and item["read_mb_per_s"] == 300.0
    report = acc.acceptance_report({"head": {"versions": {}}}, traffic=[item])
    node = report["nodes"]["head"]
    assert node["verdict"] == "FAIL" and "write 5.0 MB/s, below 20.0 MB/s" in report["lines"][0]
    assert node["storage"] == {"path": "/mnt/ray-shared", "write_mb_per_s": 5.0, "read_mb_per_s": 300.0,
                               "peer": "worker1", "floor_mb_per_s": 20.0, "error": None}
    fast = acc.storage_items([registered(json.dumps({"write_mb_per_s": 500.0})), read], "head", "worker1", "/m", 20)
    report = acc.acceptance_report({"head": {"versions": {}}}, traffic=fast)
    assert report["nodes"]["head"]["verdict"] == "PASS"
    assert "storage write 500.0 MB/s, read 300.0 MB/s (worker1's file)" in report["nodes"]["head"]["figures"]


def test_a_failed_probe_run_is_named():
    item = acc.storage_items([{"rc": 1, "stdout": "", "stderr": "runuser: user ray does not exist"}, None],
                             "w2", "head", "/mnt/ray-shared", 20)[0]
    assert item["error"] == "the write step failed: runuser: user ray does not exist"


# A node whose storage hangs (a hard NFS mount whose server is gone): its step runs out of acceptance_storage_timeout
# in the background (async); the result Ansible registers for it says so.
HUNG = {"failed": True, "msg": "async task did not complete within the requested time - 8s", "ansible_job_id": "j1",
        "finished": 0}


def test_a_hung_step_is_named_with_the_timeout_and_fails_the_node():
    assert acc.storage_hung(HUNG) is True
    # The async wrapper's own kill at the job's limit (seen in a full make test run: the wrapper's limit came before
    # the poll's), with ansible-core's words (modules/async_wrapper.py).
    assert acc.storage_hung({"failed": True, "finished": 1, "msg": "Timeout exceeded", "child_pid": 42}) is True
    # As registered by the step's task (failed_when false), seen on the lab.
    assert acc.storage_hung({"failed": False, "finished": 1, "msg": "Timeout exceeded"}) is True
    assert acc.storage_hung({"failed": True, "msg": "the probe failed"}) is False
    assert acc.storage_hung({"rc": 0, "stdout": "{}"}) is False and acc.storage_hung({"skipped": True}) is False
    assert acc.storage_hung(None) is False
    item = acc.storage_items([HUNG, {"skipped": True}], "w2", "head", "/mnt/ray-shared", 20, 8)[0]
    assert item["error"].startswith("the write step did not finish in 8 s (acceptance_storage_timeout): the "
                                    "storage hangs on this node")
    report = acc.acceptance_report({"w2": {"versions": {}}}, traffic=[item])
    assert report["nodes"]["w2"]["verdict"] == "FAIL" and "did not finish in 8 s" in report["lines"][0]


def test_the_reads_cover_only_the_nodes_whose_write_finished():
    done = registered(json.dumps({"write_mb_per_s": 500.0, "sha256": "ab", "bytes": 1}))
    hostvars = {"head": {"__acceptance_storage_write": done}, "w1": {"__acceptance_storage_write": done},
                "w2": {"__acceptance_storage_write": HUNG}, "w3": {}}
    hosts = ["head", "w1", "w2", "w3"]
    writers = acc.storage_writers(hosts, hostvars)
    assert writers == ["head", "w1"]
    # The ring skips the nodes that wrote nothing: w1 reads head's file, not w2's, and so does w2's neighbour w3.
    assert [acc.storage_peer(h, hosts, writers) for h in hosts] == ["w1", "head", "head", "head"]
    assert acc.storage_peer("head", ["head"], ["head"]) == "" and acc.storage_peer("x", hosts, writers) == ""


def test_the_storage_steps_run_in_the_background_for_the_timeout():
    tasks = __import__("yaml").safe_load((ROOT / "roles" / "acceptance" / "tasks" / "storage.yml").read_text())
    block = next(t for t in tasks if "block" in t)
    steps = {t["name"]: t for t in block["block"] if "ansible.builtin.command" in t}
    assert len(steps) == 3
    for name, step in steps.items():
        # A task timeout (`timeout:`) would drop the node from the play, unrecorded: it passed.
        assert "timeout" not in step and step["async"] == "{{ acceptance_storage_timeout | int }}", name
        assert step["poll"] == 1 and step["failed_when"] is False, name
    read = next(s for n, s in steps.items() if n.startswith("Read back"))
    assert "__acceptance_storage_writers | join(',')" in read["ansible.builtin.command"]["argv"]
    assert "not __acceptance_storage_write | raymetal.cluster.storage_hung" in read["when"]
