"""Pack a venv on the wheelhouse mirror host, or fetch and unpack it on a host that would install the same one.

Standard library and GNU tar only (run by the node's Python, ray_python, as `python3 -c`), one JSON object out:

    ray_venv_pack.py pack VENV PACK_DIR NAME
    ray_venv_pack.py unpack URL SHA256 VENV

pack: PACK_DIR/NAME becomes a tar of VENV's directory (top entry: VENV's base name), gzip -1 compressed when NAME
ends with .gz, written under a temporary name and renamed, unless it exists and is newer than VENV's install record
(.raymetal-install.json, written after each pip run); its sha256, taken as it is written, goes beside it
(NAME.sha256). Every other pack in PACK_DIR goes (another version or other inputs). Prints {"path", "sha256",
"bytes", "changed"}.

unpack: fetches URL (the mirror's nginx; no proxy, whatever the environment says) into VENV.unpack/, requires its
sha256 to be SHA256 (taken on the mirror host by `pack` and handed over by the controller, never read from the
mirror), unpacks it there (plain or gzip-compressed: GNU tar tells them apart; files owned by the user who unpacks,
root), checks that its one top entry is VENV's base name, then moves it into place (a VENV already there is moved
aside first, then removed). VENV.unpack/ goes in every case. Prints {"changed": true, "bytes": N}.

Exits 1 with one line on standard error for anything that went wrong; nothing half-made is left at VENV.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

CHUNK = 1024 * 1024
RECORD = ".raymetal-install.json"
TIMEOUT = 120


def copy_hashing(source, dest):
    """Everything `source` reads, into the file `dest`: (its sha256, hex; its size), taken in the same pass."""
    digest, size = hashlib.sha256(), 0
    with open(dest, "wb") as out:
        while True:
            block = source.read(CHUNK)
            if not block:
                return digest.hexdigest(), size
            digest.update(block)
            out.write(block)
            size += len(block)


def pack(venv, pack_dir, name):
    venv = os.path.abspath(venv)
    record = os.path.join(venv, RECORD)
    if not os.path.isfile(record):
        raise RuntimeError(f"{venv} holds no install record ({RECORD}): not a venv that raymetal installed")
    os.makedirs(pack_dir, mode=0o755, exist_ok=True)
    path = os.path.join(pack_dir, name)
    # The pack's sha256, taken while it was written, beside it.
    digest_file = path + ".sha256"
    installed = os.stat(record).st_mtime
    changed = not all(os.path.isfile(p) and os.stat(p).st_mtime >= installed for p in (path, digest_file))
    if changed:
        partial = os.path.join(pack_dir, "." + name + ".partial")
        gzip = ["--use-compress-program=gzip -1"] if name.endswith(".gz") else []
        try:
            argv = ["tar", "-C", os.path.dirname(venv), *gzip, "-cf", "-", os.path.basename(venv)]
            with tempfile.TemporaryFile() as errors, \
                    subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors) as tar:
                digest = copy_hashing(tar.stdout, partial)[0]
                if tar.wait() != 0:
                    errors.seek(0)
                    raise RuntimeError(f"tar could not pack {venv}: {errors.read().decode(errors='replace').strip()}")
            with open(partial + ".sha256", "w", encoding="ascii") as out:
                out.write(digest + "\n")
            for made in (partial, partial + ".sha256"):
                os.chmod(made, 0o644)
            os.replace(partial, path)
            os.replace(partial + ".sha256", digest_file)
        finally:
            for made in (partial, partial + ".sha256"):
                if os.path.exists(made):
                    os.unlink(made)
    for entry in os.listdir(pack_dir):
        if entry not in (name, name + ".sha256") and entry.endswith((".tar", ".tar.gz", ".sha256")):
            os.unlink(os.path.join(pack_dir, entry))
            changed = True
    with open(digest_file, encoding="ascii") as handle:
        digest = handle.read().split()[0]
    return {"path": path, "sha256": digest, "bytes": os.stat(path).st_size, "changed": changed}


def fetch(url, dest):
    """URL into dest, straight from the mirror (the environment's proxies are not for the fabric): (sha256, size)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=TIMEOUT) as answer:
        return copy_hashing(answer, dest)


def unpack(url, want, venv):
    venv = os.path.abspath(venv)
    base = os.path.basename(venv)
    work = venv + ".unpack"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, mode=0o700)
    try:
        tarball = os.path.join(work, "venv.tar")
        try:
            got, size = fetch(url, tarball)
        except OSError as err:
            raise RuntimeError(f"could not fetch {url}: {err}") from None
        if got != want:
            raise RuntimeError(f"{url} has sha256 {got}, not {want} as the mirror host packed it: not unpacked")
        tree = os.path.join(work, "tree")
        os.mkdir(tree)
        proc = subprocess.run(["tar", "-C", tree, "--no-same-owner", "-xf", tarball],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"tar could not unpack {url}: {proc.stderr.strip()}")
        top = os.listdir(tree)
        if top != [base]:
            raise RuntimeError(f"{url} holds {sorted(top)}, not one directory {base}")
        old = os.path.join(work, "old")
        if os.path.lexists(venv):
            os.rename(venv, old)
        os.rename(os.path.join(tree, base), venv)
        return {"changed": True, "bytes": size}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv):
    try:
        if len(argv) == 4 and argv[0] == "pack":
            result = pack(*argv[1:])
        elif len(argv) == 4 and argv[0] == "unpack":
            result = unpack(*argv[1:])
        else:
            raise RuntimeError("usage: pack VENV PACK_DIR NAME | unpack URL SHA256 VENV")
    except (RuntimeError, OSError) as err:
        print(f"ray_venv_pack: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
