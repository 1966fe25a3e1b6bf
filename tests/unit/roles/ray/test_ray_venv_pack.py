"""roles/ray/files/ray_venv_pack.py: the mirror host packs its venv once, another host takes it only as packed."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[4] / "roles" / "ray" / "files" / "ray_venv_pack.py"


def run(*args: str):
    # As the role runs it: the node's Python with the script's text (python3 -c), so no file of it on the node.
    return subprocess.run([sys.executable, "-c", SCRIPT.read_text(), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def venv(root: Path, name: str = "venv-2.60.0", marker: str = "one") -> Path:
    path = root / name
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "ray").write_text(f"#!{path}/bin/python\n# {marker}\n")
    (path / "bin" / "ray").chmod(0o755)
    (path / "bin" / "python").symlink_to("/usr/bin/python3")
    (path / "lib").mkdir()
    (path / "lib" / "module.py").write_text(marker)
    (path / ".raymetal-install.json").write_text('{"requirement": "ray[default]==2.60.0"}\n')
    return path


@pytest.fixture
def mirror(tmp_path):
    """The mirror's nginx stand-in: serves tmp_path/served on loopback, as the mirror serves ray_wheelhouse_dir."""
    served = tmp_path / "served"
    served.mkdir()
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def pack(src: Path, served: Path, name: str = "ray-2.60.0-0123456789abcdef.tar") -> dict:
    proc = run("pack", str(src), str(served / "venvs"), name)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_packed_venv_unpacks_file_for_file_at_the_same_path(tmp_path, mirror):
    served, url = mirror
    src = venv(tmp_path / "mirror-host")
    packed = pack(src, served)
    assert packed["changed"] is True
    assert packed["sha256"] == hashlib.sha256(Path(packed["path"]).read_bytes()).hexdigest()
    assert (os.stat(packed["path"]).st_mode & 0o777) == 0o644

    dest = tmp_path / "worker" / "venv-2.60.0"
    dest.parent.mkdir()
    proc = run("unpack", f"{url}/venvs/ray-2.60.0-0123456789abcdef.tar", packed["sha256"], str(dest))

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"changed": True, "bytes": packed["bytes"]}
    assert (dest / "lib" / "module.py").read_text() == "one"
    assert os.readlink(dest / "bin" / "python") == "/usr/bin/python3"
    assert os.access(dest / "bin" / "ray", os.X_OK)
    assert (dest / ".raymetal-install.json").exists()
    # Nothing of the work is left beside the venv.
    assert sorted(p.name for p in dest.parent.iterdir()) == ["venv-2.60.0"]


def test_a_pack_named_gz_is_compressed_and_unpacks_the_same(tmp_path, mirror):
    served, url = mirror
    src = venv(tmp_path / "mirror-host")
    (src / "lib" / "big.py").write_text("x = 1\n" * 100_000)
    plain = pack(src, served)
    packed = pack(src, served, "ray-2.60.0-0123456789abcdef.tar.gz")
    assert Path(packed["path"]).read_bytes()[:2] == b"\x1f\x8b"
    assert packed["bytes"] < plain["bytes"] / 5
    # The plain pack of the same venv went: one pack per venv.
    assert sorted(p.name for p in (served / "venvs").iterdir()) == [
        "ray-2.60.0-0123456789abcdef.tar.gz", "ray-2.60.0-0123456789abcdef.tar.gz.sha256"]
    dest = tmp_path / "worker" / "venv-2.60.0"
    dest.parent.mkdir()

    proc = run("unpack", f"{url}/venvs/ray-2.60.0-0123456789abcdef.tar.gz", packed["sha256"], str(dest))

    assert proc.returncode == 0, proc.stderr
    assert (dest / "lib" / "big.py").read_text() == (src / "lib" / "big.py").read_text()


def test_a_pack_is_made_again_only_after_the_venv_was_installed_again_and_other_packs_go(tmp_path, mirror):
    served, _ = mirror
    src = venv(tmp_path / "mirror-host")
    old = served / "venvs" / "ray-2.59.0-ffffffffffffffff.tar"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an older version's pack")
    (old.parent / (old.name + ".sha256")).write_text("0" * 64 + "\n")
    first = pack(src, served)
    assert sorted(p.name for p in old.parent.iterdir()) == [
        "ray-2.60.0-0123456789abcdef.tar", "ray-2.60.0-0123456789abcdef.tar.sha256"]
    assert pack(src, served) == {**first, "changed": False}
    # pip ran again (the role writes the install record after it): packed again, with what pip left.
    (src / "lib" / "module.py").write_text("two")
    later = time.time() + 5
    os.utime(src / ".raymetal-install.json", (later, later))
    again = pack(src, served)
    assert again["changed"] is True and again["sha256"] != first["sha256"]


def test_a_pack_that_is_not_what_the_mirror_host_packed_is_not_unpacked_and_the_old_venv_stays(tmp_path, mirror):
    served, url = mirror
    packed = pack(venv(tmp_path / "mirror-host"), served)
    dest = venv(tmp_path / "worker", marker="old")
    # Something on the fabric (or on the mirror's disk) changed the pack after the mirror host hashed it.
    with open(packed["path"], "ab") as handle:
        handle.write(b"\0" * 512)

    proc = run("unpack", f"{url}/venvs/{Path(packed['path']).name}", packed["sha256"], str(dest))

    assert proc.returncode == 1
    assert "not unpacked" in proc.stderr and packed["sha256"] in proc.stderr
    assert (dest / "lib" / "module.py").read_text() == "old"
    assert sorted(p.name for p in dest.parent.iterdir()) == ["venv-2.60.0"]


def test_a_pack_of_another_venv_path_is_refused(tmp_path, mirror):
    served, url = mirror
    packed = pack(venv(tmp_path / "mirror-host", name="venv-2.59.0"), served)
    dest = tmp_path / "worker" / "venv-2.60.0"
    dest.parent.mkdir()

    proc = run("unpack", f"{url}/venvs/{Path(packed['path']).name}", packed["sha256"], str(dest))

    assert proc.returncode == 1 and "not one directory venv-2.60.0" in proc.stderr
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_a_mirror_that_does_not_answer_leaves_nothing_and_says_which_url(tmp_path, mirror):
    _, url = mirror
    dest = tmp_path / "worker" / "venv-2.60.0"
    dest.parent.mkdir()

    proc = run("unpack", f"{url}/venvs/missing.tar.gz", "0" * 64, str(dest))

    assert proc.returncode == 1 and f"could not fetch {url}/venvs/missing.tar.gz" in proc.stderr
    assert list(dest.parent.iterdir()) == []


def test_the_environment_s_proxy_is_not_used_for_the_mirror(tmp_path, mirror, monkeypatch):
    served, url = mirror
    packed = pack(venv(tmp_path / "mirror-host"), served)
    dest = tmp_path / "worker" / "venv-2.60.0"
    dest.parent.mkdir()
    # A proxy that does not exist: the fetch would fail through it.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)

    proc = run("unpack", f"{url}/venvs/{Path(packed['path']).name}", packed["sha256"], str(dest))

    assert proc.returncode == 0, proc.stderr


def test_a_venv_without_an_install_record_is_not_packed(tmp_path):
    src = venv(tmp_path / "mirror-host")
    (src / ".raymetal-install.json").unlink()

    proc = run("pack", str(src), str(tmp_path / "venvs"), "x.tar.gz")

    assert proc.returncode == 1 and "no install record" in proc.stderr
    assert not (tmp_path / "venvs" / "x.tar.gz").exists()
