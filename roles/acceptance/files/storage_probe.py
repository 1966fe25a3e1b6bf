"""Write and read back the shared storage (raymetal_shared_storage) on one node.

Run by roles/acceptance/tasks/storage.yml as the Ray user (the program comes on stdin). A path is a directory of a
shared filesystem (stdlib only), or an ``s3://<bucket>`` URI (raymetal_shared_storage kind s3): then the probe goes
through pyarrow from Ray's venv, as Ray Train does, with the endpoint and the credentials file that Ray's own
environment file gives every Ray process (``--env-file``, its AWS_* lines), and writes objects instead of files.

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


def _is_s3(args):
    return args.dir.startswith("s3://")


def _write_chunks(write, mib):
    """Writes mib MiB through write(data); their digest."""
    digest = hashlib.sha256()
    block = os.urandom(CHUNK)
    for i in range(mib):
        # Every MiB differs (its index in front), so no layer can deduplicate the file.
        data = i.to_bytes(8, "little") + block[8:]
        write(data)
        digest.update(data)
    return digest


def _written(args, start, digest):
    seconds = max(time.monotonic() - start, 1e-6)
    return {"write_mb_per_s": round(args.mib * CHUNK / 1e6 / seconds, 1), "sha256": digest.hexdigest(),
            "bytes": args.mib * CHUNK}


def _s3_write(args):
    path = args.dir
    try:
        store = _S3(args.dir, args.env_file)
        path = store.run_path(args.run, args.host + ".bin")
        start = time.monotonic()
        # The object is stored when the stream closes (its upload completes): the S3 form of the fsync.
        with store.open_write(path) as out:
            digest = _write_chunks(out.write, args.mib)
    except OSError as exc:
        return {"error": "cannot write %s" % _why(exc, path)}
    return _written(args, start, digest)


class _S3:
    """The few filesystem calls the probe makes, on an s3:// URI through pyarrow.fs (what Ray Train uses)."""

    def __init__(self, uri, env_file):
        for name, value in _aws_env(env_file).items():
            os.environ[name] = value
        try:
            import pyarrow.fs  # noqa: PLC0415 - only Ray's venv has it, and only kind s3 needs it
        except ImportError as exc:
            raise OSError("pyarrow is not in Ray's venv (%s): Ray Train's s3:// storage_path needs it too; install"
                          " Ray with its train extra (ray_pip_extras)" % exc) from None
        self.pafs = pyarrow.fs
        self.fs, self.root = pyarrow.fs.FileSystem.from_uri(uri)

    def run_path(self, run, *parts):
        """The run's prefix, or an object in it: the S3 form of _run_dir."""
        return "/".join((self.root.rstrip("/"), ".raymetal-acceptance", run) + parts)

    def listdir(self, path):
        infos = self.fs.get_file_info(self.pafs.FileSelector(path, allow_not_found=True))
        return [info.base_name for info in infos]

    def open_write(self, path):
        return self.fs.open_output_stream(path)

    def open_read(self, path):
        if self.fs.get_file_info(path).type == self.pafs.FileType.NotFound:
            raise FileNotFoundError(errno.ENOENT, "not found", path)
        return self.fs.open_input_stream(path)

    def remove(self, path):
        if self.fs.get_file_info(path).type != self.pafs.FileType.NotFound:
            self.fs.delete_file(path)

    def remove_empty_dirs(self, paths):
        # A prefix holds nothing once its objects are gone; remove a directory marker pyarrow may have left.
        for path in paths:
            if self.listdir(path):
                break
            if self.fs.get_file_info(path).type == self.pafs.FileType.Directory:
                self.fs.delete_dir(path)


def _aws_env(env_file):
    """The AWS_* settings of Ray's environment file (KEY=value lines; no secret there, only the key file's path)."""
    found = {}
    if not env_file:
        return found
    with open(env_file, encoding="utf-8") as handle:
        for line in handle:
            key, sep, value = line.strip().partition("=")
            if sep and key.startswith("AWS_"):
                found[key] = value
    return found


def write(args):
    if _is_s3(args):
        return _s3_write(args)
    run_dir = _run_dir(args)
    path = os.path.join(run_dir, args.host + ".bin")
    try:
        os.makedirs(run_dir, mode=0o750, exist_ok=True)
        start = time.monotonic()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            digest = _write_chunks(lambda data: os.write(fd, data), args.mib)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return {"error": "cannot write %s" % _why(exc, path)}
    return _written(args, start, digest)


def read(args):
    hosts = [h for h in args.hosts.split(",") if h]
    try:
        store = _S3(args.dir, args.env_file) if _is_s3(args) else None
    except OSError as exc:
        return {"error": "cannot read %s" % _why(exc, args.dir), "missing": hosts}
    run_dir = store.run_path(args.run) if store else _run_dir(args)
    try:
        present = set(store.listdir(run_dir) if store else os.listdir(run_dir))
    except OSError as exc:
        return {"error": "cannot list %s" % _why(exc, run_dir), "missing": hosts}
    missing = [h for h in hosts if h + ".bin" not in present]
    result = {"missing": missing, "peer": args.peer}
    path = store.run_path(args.run, args.peer + ".bin") if store else os.path.join(run_dir, args.peer + ".bin")
    digest = hashlib.sha256()
    size = 0
    try:
        start = time.monotonic()
        with (store.open_read(path) if store else open(path, "rb", buffering=0)) as handle:
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
    if _is_s3(args):
        try:
            store = _S3(args.dir, args.env_file)
            run_dir = store.run_path(args.run)
            store.remove(store.run_path(args.run, args.host + ".bin"))
            store.remove_empty_dirs([run_dir, run_dir.rsplit("/", 1)[0]])
        except OSError as exc:
            return {"error": "cannot remove %s" % _why(exc, args.dir)}
        return {"cleaned": True}
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
    parser.add_argument("--env-file", default="", help="Ray's environment file (its AWS_* lines, for s3:// paths)")
    args = parser.parse_args(argv)
    result = {"write": write, "read": read, "clean": clean}[args.phase](args)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
