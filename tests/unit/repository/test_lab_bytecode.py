"""The lab nodes' bytecode cache for Ansible's module payloads (lab/files/raymetal_lab_bytecode.py).

Each case runs a fresh Python that installs the hook on a cache directory of its own and imports a module
from a zip named like Ansible's payloads, as the AnsiballZ wrapper does on a lab node.
"""
import json
import marshal
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HOOK = ROOT / "lab" / "files"
SOURCE = "def answer():\n    return 'compiled from the zip'\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the cache is root's only (as on a lab node)")


def payload(tmp_path, name="ansible_ping_payload"):
    """A zip with one module, in a directory named as the AnsiballZ wrapper names it."""
    where = tmp_path / f"{name}_x1y2" / f"{name}.zip"
    where.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(where, "w") as zf:
        zf.writestr("lab_mod.py", SOURCE)
    return where


def run(cache, zip_path):
    """Import lab_mod from zip_path with the hook on cache: its answer() and its code's file name."""
    script = (f"import sys; sys.path.insert(0, {str(HOOK)!r}); import raymetal_lab_bytecode as h; "
              f"h._install(cache={str(cache)!r}); sys.path.insert(0, {str(zip_path)!r}); import json, lab_mod; "
              "print(json.dumps([lab_mod.answer(), lab_mod.answer.__code__.co_filename]))")
    out = subprocess.run([sys.executable, "-I", "-c", script], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def cache_dir(tmp_path, mode=0o700):
    cache = tmp_path / "cache"
    cache.mkdir(mode=mode)
    cache.chmod(mode)
    return cache


def test_the_second_import_takes_the_code_from_the_cache_under_its_own_file_name(tmp_path):
    cache = cache_dir(tmp_path)
    first = payload(tmp_path / "a")
    assert run(cache, first) == ["compiled from the zip", f"{first}/lab_mod.py"]
    (entry,) = cache.iterdir()
    # Swap the stored code for other code: the next import must return what the cache holds.
    other = compile("def answer():\n    return 'read from the cache'\n", "elsewhere.py", "exec")
    entry.write_bytes(marshal.dumps(other))
    second = payload(tmp_path / "b")
    assert run(cache, second) == ["read from the cache", f"{second}/lab_mod.py"]


def test_an_unreadable_entry_is_compiled_again_and_replaced(tmp_path):
    cache = cache_dir(tmp_path)
    run(cache, payload(tmp_path / "a"))
    (entry,) = cache.iterdir()
    entry.write_bytes(b"not marshal data")
    assert run(cache, payload(tmp_path / "b"))[0] == "compiled from the zip"
    assert entry.read_bytes() != b"not marshal data"


@pytest.mark.parametrize("why", ["not an Ansible payload", "a cache others may write"])
def test_nothing_is_cached_for_other_zips_or_an_unsafe_directory(tmp_path, why):
    if why == "not an Ansible payload":
        cache, zip_path = cache_dir(tmp_path), payload(tmp_path, name="site_bundle")
    else:
        cache, zip_path = cache_dir(tmp_path, mode=0o777), payload(tmp_path)
    assert run(cache, zip_path)[0] == "compiled from the zip"
    assert list(cache.iterdir()) == []
