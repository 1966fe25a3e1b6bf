"""Hash every wheel of a wheelhouse and read what each one requires; print one JSON object.

Standard library only, so that the same step runs on the controller and on a node:

    python3 ray_wheel_hashes.py DIR

The ray role runs it on the controller over ray_wheelhouse_src (ray_install_source=wheelhouse: the hashes that
every node's pip then requires, mirror or copy, never read from the mirror), and on the node over
ray_wheelhouse_dir (ray_install_source=path, where the directory is the site's and only the node holds it).

- wheels: {file name: {"sha256": hex digest, "requires_dist": [Requires-Dist, as written], "requires_python":
  Requires-Python or ""}} for every *.whl in DIR
- refused: the source distributions in DIR (.tar.gz, .zip, ...), sorted: raymetal installs wheels only (building a
  source package runs its code as root on the node)
- problems: {file name: reason} for the wheels that cannot be read (not a zip, no METADATA)

Exits 1 with a message when DIR cannot be listed.
"""

import email.parser
import hashlib
import json
import os
import sys
import zipfile

SDIST_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar", ".zip", ".egg")
CHUNK = 1024 * 1024


def sha256(path):
    """The file's sha256, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_metadata(path):
    """(requires_dist, requires_python) read from the wheel's .dist-info/METADATA."""
    with zipfile.ZipFile(path) as archive:
        names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ValueError("%s .dist-info/METADATA files at the top of the archive" % (len(names) or "no"))
        text = archive.read(names[0]).decode("utf-8", "replace")
    headers = email.parser.HeaderParser().parsestr(text)
    return [str(r).strip() for r in headers.get_all("Requires-Dist") or []], (headers.get("Requires-Python") or "").strip()


def scan(directory):
    """What the module docstring says, as a dict."""
    names = sorted(n for n in os.listdir(directory)
                   if not n.startswith(".") and os.path.isfile(os.path.join(directory, n)))
    result = {"wheels": {}, "refused": [], "problems": {}}
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith(".whl"):
            try:
                requires, requires_python = wheel_metadata(path)
            except (OSError, ValueError, zipfile.BadZipFile, KeyError) as err:
                result["problems"][name] = "not a readable wheel (%s)" % err
                continue
            result["wheels"][name] = {"sha256": sha256(path), "requires_dist": requires,
                                      "requires_python": requires_python}
        elif name.lower().endswith(SDIST_SUFFIXES):
            result["refused"].append(name)
    return result


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    try:
        result = scan(argv[1])
    except OSError as err:
        sys.stderr.write("cannot read the wheelhouse %s: %s\n" % (argv[1], err.strerror or err))
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
