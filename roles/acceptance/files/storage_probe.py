"""Write and read back the shared storage (raymetal_shared_storage) on one node.

Run by roles/acceptance/tasks/storage.yml as the Ray user (stdlib only; the program comes on stdin):

  write  --dir D --run R --host H --mib N   writes D/.raymetal-acceptance/R/H.bin, fsyncs it, prints
                                            {"write_mb_per_s", "sha256", "bytes"}
  read   --dir D --run R --peer P --expect SHA --hosts H1,H2,...
                                            reads P's file back and checks its digest, lists which hosts' files
                                            this node cannot see, prints {"read_mb_per_s", "digest_ok", "missing"}
  clean  --dir D --run R --host H           removes this node's file, and the run's directory once it is empty

Every outcome is one JSON object on stdout; a failure is {"error": "..."} with exit status 0, so that the report can
name the node and the cause. A directory that is local to each node (nothing shared) is found by ``read``: the
peer's file is not there, and every other host's is missing.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import sys
import time

CHUNK = 1 << 20


def _run_dir(args):
    return os.path.join(args.dir, ".raymetal-acceptance", args.run)


def _why(exc, path):
    text = "%s: %s" % (path, exc.strerror or exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        text += (" (the Ray user cannot write or read it here: the share must be writable by the Ray user, with the"
                 " same uid on every node)")
    return text


def write(args):
    run_dir = _run_dir(args)
    path = os.path.join(run_dir, args.host + ".bin")
    digest = hashlib.sha256()
    block = os.urandom(CHUNK)
    try:
        os.makedirs(run_dir, mode=0o750, exist_ok=True)
        start = time.monotonic()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            for i in range(args.mib):
                # Every MiB differs (its index in front), so no layer can deduplicate the file.
                data = i.to_bytes(8, "little") + block[8:]
                os.write(fd, data)
                digest.update(data)
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = max(time.monotonic() - start, 1e-6)
    except OSError as exc:
        return {"error": "cannot write %s" % _why(exc, path)}
    return {"write_mb_per_s": round(args.mib * CHUNK / 1e6 / seconds, 1), "sha256": digest.hexdigest(),
            "bytes": args.mib * CHUNK}


def read(args):
    run_dir = _run_dir(args)
    hosts = [h for h in args.hosts.split(",") if h]
    try:
        present = set(os.listdir(run_dir))
    except OSError as exc:
        return {"error": "cannot list %s" % _why(exc, run_dir), "missing": hosts}
    missing = [h for h in hosts if h + ".bin" not in present]
    result = {"missing": missing, "peer": args.peer}
    path = os.path.join(run_dir, args.peer + ".bin")
    digest = hashlib.sha256()
    size = 0
    try:
        start = time.monotonic()
        with open(path, "rb", buffering=0) as handle:
            while True:
                data = handle.read(CHUNK)
                if not data:
                    break
                size += len(data)
                digest.update(data)
        seconds = max(time.monotonic() - start, 1e-6)
    except FileNotFoundError:
        result["error"] = ("%s's file is not here (%s): this path is not one filesystem shared by the nodes"
                           % (args.peer, path))
        return result
    except OSError as exc:
        result["error"] = "cannot read %s's file %s" % (args.peer, _why(exc, path))
        return result
    result["read_mb_per_s"] = round(size / 1e6 / seconds, 1)
    result["digest_ok"] = digest.hexdigest() == args.expect
    if not result["digest_ok"]:
        result["error"] = ("%s's file reads back different from what %s wrote (%d bytes): the storage lost or changed"
                           " data" % (args.peer, args.peer, size))
    elif missing:
        result["error"] = ("the files of %s are not visible here: this path is not one filesystem shared by every"
                           " node" % ", ".join(missing))
    return result


def clean(args):
    run_dir = _run_dir(args)
    try:
        os.unlink(os.path.join(run_dir, args.host + ".bin"))
    except FileNotFoundError:
        pass
    except OSError as exc:
        return {"error": "cannot remove %s" % _why(exc, run_dir)}
    for path in (run_dir, os.path.dirname(run_dir)):
        try:
            os.rmdir(path)
        except OSError:
            break
    return {"cleaned": True}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("write", "read", "clean"))
    parser.add_argument("--dir", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--host", default="")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--peer", default="")
    parser.add_argument("--expect", default="")
    parser.add_argument("--hosts", default="")
    args = parser.parse_args(argv)
    result = {"write": write, "read": read, "clean": clean}[args.phase](args)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
