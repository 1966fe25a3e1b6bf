"""Installs that cannot be spoofed (issue 35): wheels only, hashed on the controller, required by pip.

- roles/ray/files/ray_wheel_hashes.py (stdlib; the controller over ray_wheelhouse_src, the node over a `path`
  directory) on wheels made here, a source package and a broken wheel;
- the filters wheelhouse_hash_requirements (the node's --require-hashes requirements file), wheelhouse_sdists and
  pip_hash_mismatches, on those wheels and on fixtures recorded from the lab's real wheelhouse
  (tests/fixtures/wheelhouse: its scan, the 58 packages pip 23.0.1 of Debian 12 installed from it with the file
  this filter wrote, and pip's answer to a wheel changed by one byte);
- the real pip of this venv run on the file the filter writes: installs the wheels, refuses a changed one;
- roles/ray/files/ray_wheelhouse.py downloads wheels only and refuses a wheelhouse with a source package in it.
"""

from __future__ import annotations

import importlib.util

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.raymetal.cluster.plugins.filter import wheelhouse as whfilter

# The builder runs as a file of the ray role (so it ships with the collection); loaded as the task runs it.
_BUILDER = importlib.util.spec_from_file_location(
    "ray_wheelhouse", Path(__file__).resolve().parents[4] / "roles" / "ray" / "files" / "ray_wheelhouse.py")
wh = importlib.util.module_from_spec(_BUILDER)
_BUILDER.loader.exec_module(wh)

ROOT = Path(__file__).resolve().parents[4]
SCRIPT = ROOT / "roles" / "ray" / "files" / "ray_wheel_hashes.py"
FIXTURES = ROOT / "tests" / "fixtures" / "wheelhouse"


def make_wheel(directory, filename, requires=(), requires_python=""):
    """A minimal wheel that pip installs: METADATA, WHEEL, RECORD and one module."""
    name, version = filename.split("-")[:2]
    dist_info = "%s-%s.dist-info" % (name, version)
    meta = ["Metadata-Version: 2.1", "Name: %s" % name, "Version: %s" % version]
    meta += ["Requires-Dist: %s" % r for r in requires]
    if requires_python:
        meta.append("Requires-Python: %s" % requires_python)
    path = Path(directory) / filename
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("%s.py" % name, "VALUE = %r\n" % filename)
        archive.writestr(dist_info + "/METADATA", "\n".join(meta) + "\n")
        archive.writestr(dist_info + "/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: %s\n" % "-".join(filename[:-4].split("-")[-3:]))
        archive.writestr(dist_info + "/RECORD", "")
    return path


def run_scan(directory):
    """The script as the role runs it: the node's (here this) Python, its text given with -c."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT.read_text(), str(directory)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture()
def wheelhouse(tmp_path):
    """A wheelhouse like pip download makes one, for two Pythons, with a second Ray beside the first."""
    d = tmp_path / "wh"
    d.mkdir()
    make_wheel(d, "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl",
               ["click>=7.0", "aiohttp>=3.7; extra == \"default\"", "grpcio>=1.42; python_version < \"3.12\"",
                "grpcio>=1.66; python_version >= \"3.12\"", "pywin32; sys_platform == \"win32\""])
    make_wheel(d, "ray-2.60.0-cp313-cp313-manylinux2014_x86_64.whl",
               ["click>=7.0", "aiohttp>=3.7; extra == \"default\"", "grpcio>=1.42; python_version < \"3.12\"",
                "grpcio>=1.66; python_version >= \"3.12\""])
    make_wheel(d, "ray-2.59.0-cp311-cp311-manylinux2014_x86_64.whl", ["click>=7.0,<8"])
    make_wheel(d, "click-7.1.2-py2.py3-none-any.whl")
    make_wheel(d, "click-8.5.1-py3-none-any.whl", requires_python=">=3.10")
    make_wheel(d, "aiohttp-3.14.5-cp311-cp311-manylinux_2_17_x86_64.whl", ["yarl>=1.0"])
    make_wheel(d, "aiohttp-3.14.5-cp313-cp313-manylinux_2_17_x86_64.whl", ["yarl>=1.0"])
    make_wheel(d, "aiohttp-3.14.5-cp311-cp311-manylinux_2_17_aarch64.whl", ["yarl>=1.0"])
    make_wheel(d, "yarl-1.25.1-py3-none-any.whl")
    make_wheel(d, "yarl-1.25.1-cp311-cp311-manylinux_2_17_x86_64.whl")
    make_wheel(d, "grpcio-1.50.0-cp311-cp311-manylinux_2_17_x86_64.whl")
    make_wheel(d, "grpcio-1.85.3-cp313-cp313-manylinux_2_17_x86_64.whl")
    # Left over from an earlier ray_pip_packages: in the wheelhouse, asked for by nobody.
    make_wheel(d, "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl")
    (d / ".complete-3.11").write_text("")
    return d


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def requirement_lines(text):
    """{pin: [hashes]} of a requirements file with continuation lines."""
    found, current = {}, None
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        words = line.split()
        current = words[0]
        found[current] = [w.split(":", 1)[1] for w in words[1:] if w.startswith("--hash=sha256:")]
    return found


# --- the red test: every install from a wheelhouse is wheels only and hash-checked ---

@pytest.mark.parametrize("source,fanout,is_mirror", [("wheelhouse", "mirror", False), ("wheelhouse", "mirror", True),
                                                      ("wheelhouse", "copy", False), ("path", "mirror", False)],
                         ids=["mirror-client", "mirror-host", "copy", "path"])
def test_every_install_from_a_wheelhouse_takes_wheels_only_and_requires_hashes(source, fanout, is_mirror):
    args = whfilter.wheelhouse_pip_source(source, fanout, is_mirror, "10.0.0.10", 8480, "/w")["args"]
    assert "--require-hashes" in args, args
    assert args[args.index("--only-binary") + 1] == ":all:", args
    assert "--no-index" in args


# --- ray_wheel_hashes.py ---

def test_the_scan_hashes_every_wheel_and_reads_what_it_requires(wheelhouse):
    (wheelhouse / "PyYAML-6.0.3.tar.gz").write_text("sdist")
    (wheelhouse / "broken-1.0-py3-none-any.whl").write_text("not a zip")
    (wheelhouse / "notes.txt").write_text("ignored")
    found = run_scan(wheelhouse)
    assert sorted(found) == ["problems", "refused", "wheels"]
    assert len(found["wheels"]) == 13
    ray = found["wheels"]["ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl"]
    assert ray["sha256"] == sha(wheelhouse / "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl")
    assert ray["requires_dist"][:2] == ["click>=7.0", "aiohttp>=3.7; extra == \"default\""]
    assert found["wheels"]["click-8.5.1-py3-none-any.whl"]["requires_python"] == ">=3.10"
    assert found["refused"] == ["PyYAML-6.0.3.tar.gz"]
    assert list(found["problems"]) == ["broken-1.0-py3-none-any.whl"]
    assert "not a readable wheel" in found["problems"]["broken-1.0-py3-none-any.whl"]


def test_the_scan_of_a_missing_directory_is_a_message(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT.read_text(), str(tmp_path / "nope")], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 1 and "cannot read the wheelhouse %s" % (tmp_path / "nope") in proc.stderr


# --- wheelhouse_hash_requirements ---

def test_each_node_gets_every_package_it_installs_pinned_with_the_hashes_of_its_own_wheels(wheelhouse):
    scan = run_scan(wheelhouse)
    got = whfilter.wheelhouse_hash_requirements(scan, ["ray[default]==2.60.0"], "3.11.2", "x86_64", "WH")
    assert got["pins"] == {"aiohttp": "3.14.5", "click": "8.5.1", "grpcio": "1.50.0", "ray": "2.60.0",
                           "yarl": "1.25.1"}
    lines = requirement_lines(got["text"])
    assert sorted(lines) == ["aiohttp==3.14.5", "click==8.5.1", "grpcio==1.50.0", "ray[default]==2.60.0",
                             "yarl==1.25.1"]
    # Only the wheels this Python and machine take (not cp313's Ray, not aarch64's aiohttp), every one of them.
    assert lines["ray[default]==2.60.0"] == [sha(wheelhouse / "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl")]
    assert sorted(lines["yarl==1.25.1"]) == sorted(sha(p) for p in wheelhouse.glob("yarl-*.whl"))
    assert "numpy" not in got["text"]
    assert got["text"].startswith("# Written by raymetal") and "hashed in WH." in got["text"]
    # Python 3.13: its own Ray wheel, its own grpcio (another marker holds).
    got = whfilter.wheelhouse_hash_requirements(scan, ["ray[default]==2.60.0"], "3.13.5", "x86_64", "WH")
    assert got["pins"]["grpcio"] == "1.85.3"
    assert requirement_lines(got["text"])["ray[default]==2.60.0"] == [
        sha(wheelhouse / "ray-2.60.0-cp313-cp313-manylinux2014_x86_64.whl")]


def test_an_older_ray_beside_the_new_one_pins_what_that_ray_needs(wheelhouse):
    got = whfilter.wheelhouse_hash_requirements(run_scan(wheelhouse), ["ray==2.59.0"], "3.11.2", "x86_64")
    # ray 2.59.0 asks for click<8, and no extra: no aiohttp, and the older click.
    assert got["pins"] == {"click": "7.1.2", "ray": "2.59.0"}
    assert got["files"] == ["click-7.1.2-py2.py3-none-any.whl", "ray-2.59.0-cp311-cp311-manylinux2014_x86_64.whl"]


def test_requires_python_leaves_a_wheel_out(wheelhouse):
    # click 8.5.1 needs Python 3.10 or newer: a 3.9 node would take 7.1.2, if its Ray allowed.
    got = whfilter.wheelhouse_hash_requirements(run_scan(wheelhouse), ["click>=7"], "3.9.2", "x86_64")
    assert got["pins"] == {"click": "7.1.2"}


def test_what_the_wheelhouse_lacks_is_named_with_who_asked(wheelhouse):
    scan = run_scan(wheelhouse)
    with pytest.raises(AnsibleFilterError) as err:
        whfilter.wheelhouse_hash_requirements(scan, ["ray[default]==2.60.0", "torch==2.9.0"], "3.11.2", "x86_64", "WH")
    assert "WH has no wheel that fits torch (torch==2.9.0 from the requirements; the wheelhouse has no wheel for " \
           "Python 3.11.2 on x86_64)" in str(err.value)
    del scan["wheels"]["yarl-1.25.1-py3-none-any.whl"], scan["wheels"]["yarl-1.25.1-cp311-cp311-manylinux_2_17_x86_64.whl"]
    with pytest.raises(AnsibleFilterError, match=r"yarl \(yarl>=1.0 from aiohttp 3.14.5;"):
        whfilter.wheelhouse_hash_requirements(scan, ["ray[default]==2.60.0"], "3.11.2", "x86_64", "WH")
    with pytest.raises(AnsibleFilterError, match="is not a pip requirement"):
        whfilter.wheelhouse_hash_requirements(scan, ["ray[=="], "3.11.2", "x86_64")


def test_a_source_package_or_a_broken_wheel_is_refused_by_name(wheelhouse):
    scan = run_scan(wheelhouse)
    scan["refused"] = ["PyYAML-6.0.3.tar.gz"]
    with pytest.raises(AnsibleFilterError) as err:
        whfilter.wheelhouse_hash_requirements(scan, ["ray==2.60.0"], "3.11.2", "x86_64", "/srv/wh (ray_wheelhouse_src)")
    assert str(err.value).startswith("/srv/wh (ray_wheelhouse_src) holds source distributions, which raymetal never "
                                     "installs")
    assert "PyYAML-6.0.3.tar.gz" in str(err.value)
    scan["refused"] = []
    scan["problems"] = {"broken-1.0-py3-none-any.whl": "not a readable wheel (File is not a zip file)"}
    with pytest.raises(AnsibleFilterError, match="broken-1.0-py3-none-any.whl: not a readable wheel"):
        whfilter.wheelhouse_hash_requirements(scan, ["ray==2.60.0"], "3.11.2", "x86_64")


def test_wheelhouse_sdists_names_the_source_packages():
    assert whfilter.wheelhouse_sdists(["/w/ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl", "/w/PyYAML-6.0.3.tar.gz",
                                       "pkg-1.0.zip", "/w/.complete-3.11", "notes.txt"]) == ["PyYAML-6.0.3.tar.gz",
                                                                                             "pkg-1.0.zip"]
    assert whfilter.wheelhouse_sdists([]) == []


def test_the_lab_wheelhouse_gives_exactly_what_pip_installed_from_it():
    """The scan of the lab's real wheelhouse (Ray 2.59.0 and 2.60.0, NCCL, Python 3.11 and 3.13 wheels)."""
    scan = json.loads((FIXTURES / "lab-ray-2.59-2.60-scan.json").read_text())
    got = whfilter.wheelhouse_hash_requirements(scan, ["ray[default]==2.60.0", "nvidia-nccl-cu12==2.32.3"], "3.11.2",
                                                "x86_64", "WH")
    installed = (FIXTURES / "pip-23.0.1-installed-cp311.txt").read_text().split()
    assert sorted("%s-%s" % item for item in got["pins"].items()) == sorted(installed)
    assert all(len(hashes) >= 1 for hashes in requirement_lines(got["text"]).values())
    assert not [f for f in got["files"] if "cp313" in f]
    older = whfilter.wheelhouse_hash_requirements(scan, ["ray[default]==2.59.0"], "3.13.5", "x86_64", "WH")
    assert older["pins"]["ray"] == "2.59.0" and "nvidia-nccl-cu12" not in older["pins"]
    assert [f for f in older["files"] if f.startswith("ray-")] == ["ray-2.59.0-cp313-cp313-manylinux2014_x86_64.whl"]


# --- pip_hash_mismatches ---

def test_pips_hash_refusal_is_read_file_by_file():
    stderr = (FIXTURES / "pip-23.0.1-hash-mismatch.stderr").read_text()
    assert whfilter.pip_hash_mismatches(stderr) == [{
        "requirement": "six==1.17.0", "url": "http://10.231.20.10:8480/six-1.17.0-py2.py3-none-any.whl",
        "file": "six-1.17.0-py2.py3-none-any.whl",
        "expected": ["4721f391ed90541fddacab5acf947aa0d3dc7d27b2e1e8eda2be8970586c3274"],
        "got": "3e89802664d6247cd6c3821526576c10d088e9b58524aed2313af3be054ecf7d"}]
    assert whfilter.pip_hash_mismatches("ERROR: No matching distribution found for ray==2.61.0\n") == []
    assert whfilter.pip_hash_mismatches(None) == []


# --- the real pip on the file the filter writes ---

def pip_install(wheelhouse, requirements, target):
    return subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-index",
                           "--find-links", str(wheelhouse), "--only-binary", ":all:", "--require-hashes",
                           "--target", str(target), "-r", str(requirements)],
                          capture_output=True, text=True, check=False, env={"PIP_CONFIG_FILE": "/dev/null",
                                                                             "PATH": "/usr/bin:/bin"})


def test_pip_installs_from_the_file_and_refuses_a_wheel_changed_after_hashing(wheelhouse, tmp_path):
    got = whfilter.wheelhouse_hash_requirements(run_scan(wheelhouse), ["ray[default]==2.60.0"],
                                                "%d.%d.%d" % sys.version_info[:3], "x86_64", "WH")
    requirements = tmp_path / "hashes.txt"
    requirements.write_text(got["text"])
    proc = pip_install(wheelhouse, requirements, tmp_path / "ok")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "ok").glob("*.py")) == ["aiohttp.py", "click.py", "grpcio.py", "ray.py",
                                                                      "yarl.py"]
    # Someone changes one wheel after the controller hashed it (the mirror's copy, or what answers for its address).
    changed = wheelhouse / "click-8.5.1-py3-none-any.whl"
    with zipfile.ZipFile(changed, "a") as archive:
        archive.writestr("click_payload.py", "import os\n")
    proc = pip_install(wheelhouse, requirements, tmp_path / "bad")
    assert proc.returncode != 0
    refused = whfilter.pip_hash_mismatches(proc.stderr)
    assert [m["file"] for m in refused] == ["click-8.5.1-py3-none-any.whl"], proc.stderr
    assert refused[0]["got"] == sha(changed)
    assert not (tmp_path / "bad" / "click_payload.py").exists()


# --- roles/ray/files/ray_wheelhouse.py: wheels only ---

def test_the_builder_downloads_wheels_only_and_refuses_a_source_package(tmp_path):
    calls = []

    def pip(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    wh.build(str(tmp_path / "wh"), ["ray==2.60.0"], [], run=pip)
    assert all("--only-binary=:all:" in cmd for cmd in calls), calls
    (tmp_path / "wh" / "PyYAML-6.0.3.tar.gz").write_text("sdist")
    with pytest.raises(wh.WheelhouseError) as err:
        wh.build(str(tmp_path / "wh"), ["ray==2.60.0"], [], run=pip)
    assert "holds source distributions" in str(err.value) and "PyYAML-6.0.3.tar.gz" in str(err.value)
    assert len(calls) == 1  # refused before pip ran again


# --- the role ---

def test_the_hashes_file_lies_in_the_config_directory_made_as_configure_makes_it():
    """install-venv.yml makes ray_config_dir for the hashes file before configure.yml does: the same entry, or the
    two would change its owner or mode back and forth on every run."""
    import yaml

    role = ROOT / "roles" / "ray"
    role_vars = yaml.safe_load((role / "vars" / "main.yml").read_text())
    assert role_vars["__ray_hashes_file"].startswith("{{ ray_config_dir }}/")
    tasks = yaml.safe_load((role / "tasks" / "configure.yml").read_text())
    dirs = next(t for t in tasks if "raymetal.cluster.node_files" in t)["vars"]["__ray_config_dirs"]
    assert role_vars["__ray_config_dir_entry"] in dirs
    # The fast path watches ray_config_dir, so a hand edit of the hashes file sends the next deploy the full way.
    watched = yaml.safe_load((ROOT / "playbooks" / "vars" / "applied_state.yml").read_text())["raymetal_applied_watch"]
    assert "{{ ray_config_dir }}" in watched["paths"]
    install = yaml.safe_load((role / "tasks" / "install-venv.yml").read_text())
    pip = next(t for t in install if "block" in t)["block"][0]["ansible.builtin.pip"]
    assert pip["requirements"] == "{{ __ray_hashes_file if __ray_hashed_run else omit }}"
