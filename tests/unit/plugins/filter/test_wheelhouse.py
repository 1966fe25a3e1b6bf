"""The wheelhouse builder (roles/ray/files/ray_wheelhouse.py) and the preflight filter (plugins/filter/wheelhouse.py).

pip itself is replaced by a recorder that plays a package index: the tests
check which pip commands the builder runs, what it reports, and what it says
when a package is missing. The real download of numpy is in
tests/lab/test_workstation_job.py.
"""

from __future__ import annotations

import importlib.util

import os
import subprocess
from pathlib import Path

import pytest

from ansible_collections.raymetal.cluster.plugins.filter import wheelhouse as whfilter

# The builder runs as a file of the ray role (so it ships with the collection); loaded as the task runs it.
_BUILDER = importlib.util.spec_from_file_location(
    "ray_wheelhouse", Path(__file__).resolve().parents[4] / "roles" / "ray" / "files" / "ray_wheelhouse.py")
wh = importlib.util.module_from_spec(_BUILDER)
_BUILDER.loader.exec_module(wh)

ROOT = Path(__file__).resolve().parents[4]

HERE = {"python": "3.11", "machine": "x86_64", "glibc": "2.36"}


def test_same_python_machine_and_newer_glibc_is_a_plain_download():
    assert wh.target_args("3.11", "x86_64", "2.36", here=HERE) == ([], "native")
    assert wh.target_args("", "", "", here=HERE) == ([], "native")
    assert wh.target_args("3.11", "x86_64", "2.39", here=HERE) == ([], "native")


def test_other_python_or_older_glibc_gets_wheels_for_the_nodes():
    args, mode = wh.target_args("3.12", "x86_64", "2.28", here=HERE)
    assert mode == "cross"
    assert args[:7] == ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
    tags = args[8::2]
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags  # newer than the nodes' glibc
    args, mode = wh.target_args("3.11", "aarch64", "2.36", here=HERE)
    assert mode == "cross" and "manylinux_2_36_aarch64" in args and "manylinux1_aarch64" not in args
    args, _ = wh.target_args("3.11", "", "", ["manylinux_2_28_x86_64"], here=HERE)
    assert args[-2:] == ["--platform", "manylinux_2_28_x86_64"]


def test_bad_target_is_a_message():
    with pytest.raises(wh.WheelhouseError, match="not of the form 3.N"):
        wh.target_args("311", here=HERE)
    with pytest.raises(wh.WheelhouseError, match="ray_wheelhouse_platforms"):
        wh.target_args("3.12", "x86_64", "", here=dict(HERE, glibc=""))  # musl, or unknown


class FakePip:
    """pip download against a fake index: offline it finds what is in dest, online it 'downloads'."""

    def __init__(self, index):
        self.index = index  # requirement -> file name
        self.calls = []

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        reqs = [a for a in cmd if a in self.index or a.startswith("nope")]
        offline = "--no-index" in cmd
        for req in reqs:
            name = self.index.get(req)
            if name is None or (offline and not (dest / name).exists()):
                return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for %s\n" % req)
        for req in reqs:
            (dest / self.index[req]).write_text("wheel")
        return subprocess.CompletedProcess(cmd, 0, "", "")


def test_build_downloads_once_then_is_idempotent(tmp_path):
    pip = FakePip({"ray==2.60.0": "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl",
                   "numpy==2.4.6": "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"})
    dest = str(tmp_path / "wh")
    report = wh.build(dest, ["ray==2.60.0", "numpy==2.4.6"], [], run=pip)
    assert report["changed"] is True
    assert report["added"] == ["numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",
                               "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl"]
    assert "--no-index" in pip.calls[0] and "--no-index" not in pip.calls[1]
    again = wh.build(dest, ["ray==2.60.0", "numpy==2.4.6"], [], run=pip)
    assert again["changed"] is False and again["added"] == []
    assert len(pip.calls) == 3  # the rerun only asked the wheelhouse itself


def test_held_versions_names_each_distribution_present_in_one_version():
    files = ["ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl", "filelock-4.2.11-py3-none-any.whl",
             "PyYAML-6.0.3.tar.gz", "typing_extensions-4.15.0-py3-none-any.whl",
             "idna-3.10-py3-none-any.whl", "idna-3.11-py3-none-any.whl", "README"]
    assert wh.held_versions(files) == {"ray": "2.60.0", "filelock": "4.2.11", "pyyaml": "6.0.3",
                                       "typing-extensions": "4.15.0"}


class ConstrainedPip(FakePip):
    """FakePip that records the constraints it was given and may refuse them."""

    def __init__(self, index, refuse_constraints=False):
        super().__init__(index)
        self.constraints = []
        self.refuse = refuse_constraints

    def __call__(self, cmd, **kwargs):
        if "--constraint" in cmd:
            self.constraints.append(Path(cmd[cmd.index("--constraint") + 1]).read_text().split())
            if self.refuse:
                self.calls.append(cmd)
                return subprocess.CompletedProcess(cmd, 1, "", "ERROR: ResolutionImpossible\n")
        return super().__call__(cmd, **kwargs)


@pytest.mark.parametrize("refuse", [False, True], ids=["kept", "conflict"])
def test_adding_a_package_keeps_the_versions_the_wheelhouse_holds(tmp_path, refuse):
    dest = tmp_path / "wh"
    dest.mkdir()
    for name in ("ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl", "filelock-4.2.11-py3-none-any.whl"):
        (dest / name).write_text("wheel")
    pip = ConstrainedPip({"numpy==2.4.6": "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"}, refuse)
    report = wh.build(str(dest), ["numpy==2.4.6"], [], run=pip)
    assert pip.constraints == [["filelock==4.2.11", "ray==2.60.0"]]
    assert report["added"] == ["numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"]
    # Constraints that pip cannot honour fall back to a plain download.
    assert len(pip.calls) == (3 if refuse else 2)
    assert not [f for f in os.listdir(tmp_path) if f.startswith("wheelhouse-held-")]


def test_build_names_the_package_pip_cannot_find(tmp_path):
    pip = FakePip({"ray==2.60.0": "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl"})
    with pytest.raises(wh.WheelhouseError) as err:
        wh.build(str(tmp_path / "wh"), ["ray==2.60.0", "nope==1.0"], ["--python-version", "3.12"], index_url="http://i/simple",
                 run=pip)
    assert "No matching distribution found for nope==1.0" in str(err.value)
    assert pip.calls[1][pip.calls[1].index("--index-url") + 1] == "http://i/simple"
    assert "--python-version" in pip.calls[1]


def test_cli_prints_json_or_a_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(wh, "build", lambda *a, **k: (_ for _ in ()).throw(wh.WheelhouseError("boom")))
    assert wh.main(["--dest", str(tmp_path), "ray==2.60.0"]) == 1
    assert capsys.readouterr().err.strip() == "wheelhouse: boom"


WHEELS = ["/wh/ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl",
          "/wh/numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
          "/wh/PyYAML-6.0.3.tar.gz", "/wh/.complete-ray-2.60.0"]


def test_wheelhouse_missing_names_only_what_is_absent():
    assert whfilter.wheelhouse_missing(["ray[default]==2.60.0", "numpy==2.4.6", "pyyaml>=6", "NumPy"], WHEELS) == []
    assert whfilter.wheelhouse_missing(["ray[default]==2.61.0", "numpy==2.4.6", "torch==2.9.1"], WHEELS) == [
        "ray[default]==2.61.0", "torch==2.9.1"]
    assert whfilter.wheelhouse_missing(["numpy"], []) == ["numpy"]
    assert whfilter.wheelhouse_missing(["bad req !"], WHEELS)[0].startswith("bad req ! (not a pip requirement: ")


# One wheelhouse holding the wheels of Debian 12's Python (3.11) and Debian 13's (3.13) side by side,
# as the lab's does: names as pip downloaded them.
MIXED = ["ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl", "ray-2.60.0-cp313-cp313-manylinux2014_x86_64.whl",
         "grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
         "grpcio-1.85.3-cp313-cp313-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
         "cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl", "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",
         "nvidia_nccl_cu12-2.32.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
         "six-1.17.0-py2.py3-none-any.whl", "PyYAML-6.0.3.tar.gz", ".complete-ray-2.60.0-py3.13", "README"]


def test_each_python_gets_its_own_wheels_and_the_shared_ones():
    shared = ["cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl", "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",
              "nvidia_nccl_cu12-2.32.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
              "six-1.17.0-py2.py3-none-any.whl", "PyYAML-6.0.3.tar.gz"]
    assert whfilter.wheelhouse_for_python(MIXED, "3.13.5") == [
        "ray-2.60.0-cp313-cp313-manylinux2014_x86_64.whl",
        "grpcio-1.85.3-cp313-cp313-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"] + shared
    assert whfilter.wheelhouse_for_python(MIXED, "3.11") == [
        "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl",
        "grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"] + shared
    # Python 3.10 cannot use the cp311 abi3 wheel; 3.12 finds no ray at all.
    assert "cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl" not in whfilter.wheelhouse_for_python(MIXED, "3.10")
    assert whfilter.wheelhouse_missing(["ray[default]==2.60.0", "nvidia-nccl-cu12==2.32.3"],
                                       whfilter.wheelhouse_for_python(MIXED, "3.12")) == ["ray[default]==2.60.0"]
    # Paths keep their directories.
    assert whfilter.wheelhouse_for_python(["/wh/" + MIXED[1]], "3.13") == ["/wh/" + MIXED[1]]


def test_a_bad_python_release_is_a_message_not_a_traceback():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="not a Python release: 'python3'"):
        whfilter.wheelhouse_for_python(MIXED, "python3")


def test_wheelhouse_pythons_names_the_releases_a_project_is_built_for():
    assert whfilter.wheelhouse_pythons(MIXED, "ray") == ["3.11", "3.13"]
    assert whfilter.wheelhouse_pythons(MIXED, "cryptography") == ["3.11+"]
    assert whfilter.wheelhouse_pythons(MIXED, "nvidia-nccl-cu12") == ["any"]
    assert whfilter.wheelhouse_pythons(MIXED, "pyyaml") == ["any"]
    assert whfilter.wheelhouse_pythons(MIXED, "torch") == []


# --- wheelhouse_pip_source: where each node's pip run takes Ray's packages from (issue 16) ---

def pip_source(*args, **kwargs):
    return whfilter.wheelhouse_pip_source(*args, **kwargs)


def test_with_the_mirror_every_other_node_installs_over_http_from_the_mirror_host():
    got = pip_source("wheelhouse", "mirror", False, "10.0.0.10", 8480, "/var/cache/raymetal/wheelhouse")
    assert got["kind"] == "mirror"
    assert got["args"] == ["--no-index", "--find-links", "http://10.0.0.10:8480/", "--trusted-host", "10.0.0.10",
                           "--no-cache-dir", "--only-binary", ":all:", "--require-hashes"]
    assert got["where"] == "http://10.0.0.10:8480/"


def test_the_mirror_host_itself_installs_from_its_own_directory():
    got = pip_source("wheelhouse", "mirror", True, "10.0.0.10", 8480, "/var/cache/raymetal/wheelhouse")
    assert got == {"kind": "local", "args": ["--no-index", "--find-links", "/var/cache/raymetal/wheelhouse",
                                             "--only-binary", ":all:", "--require-hashes"],
                   "where": "/var/cache/raymetal/wheelhouse"}
    # Ansible may hand the flag over as a string.
    assert pip_source("wheelhouse", "mirror", "True", "10.0.0.10", 8480, "/w")["kind"] == "local"
    assert pip_source("wheelhouse", "mirror", "False", "10.0.0.10", 8480, "/w")["kind"] == "mirror"


def test_copy_and_path_install_from_the_nodes_directory_and_never_from_the_mirror():
    for source, fanout in (("wheelhouse", "copy"), ("path", "mirror"), ("path", "copy")):
        got = pip_source(source, fanout, False, "10.0.0.10", 8480, "/srv/wh")
        assert got["kind"] == "local" and got["args"] == ["--no-index", "--find-links", "/srv/wh", "--only-binary",
                                                          ":all:", "--require-hashes"], (source, fanout)


def test_an_index_ignores_the_mirror():
    assert pip_source("index", "mirror", False, "10.0.0.10", 8480, "/w", "https://pypi.example/simple") == {
        "kind": "index", "args": ["--index-url", "https://pypi.example/simple"], "where": "https://pypi.example/simple"}
    assert pip_source("index", "mirror", True, "10.0.0.10", 8480, "/w", "")["args"] == []


def test_unknown_settings_are_named():
    with pytest.raises(ValueError, match="ray_install_source='ftp'"):
        pip_source("ftp")
    with pytest.raises(ValueError, match="ray_wheelhouse_fanout='torrent'"):
        pip_source("wheelhouse", "torrent", False, "10.0.0.10", 8480, "/w")
