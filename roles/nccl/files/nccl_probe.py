"""Load libnccl.so.2 and print what it is, as JSON (stdlib only; needs no GPU).

Run by the python that NCCL is for: Ray's venv for the wheel (its nvidia.nccl
package holds the library), the system's python3 for a distribution package
(found through the dynamic linker). Usage: nccl_probe.py wheel|package
Prints {"code": 23203, "version": "2.32.3", "library": "/path/libnccl.so.2"};
exits non-zero with the reason when the library is missing or does not load.
"""

import ctypes
import importlib.util
import json
import os
import sys


def library_path(method):
    if method != "wheel":
        return "libnccl.so.2"
    spec = importlib.util.find_spec("nvidia.nccl")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("package nvidia.nccl is not installed for %s" % sys.executable)
    return os.path.join(list(spec.submodule_search_locations)[0], "lib", "libnccl.so.2")


def version_string(code):
    # NCCL encodes 2.9.0 and later as MAJOR*10000 + MINOR*100 + PATCH, older releases as *1000.
    if code >= 20900:
        return "%d.%d.%d" % (code // 10000, code % 10000 // 100, code % 100)
    return "%d.%d.%d" % (code // 1000, code % 1000 // 100, code % 100)


def loaded_from(default):
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "libnccl.so" in line:
                return line.split()[-1]
    return default


def main(argv):
    path = library_path(argv[1] if len(argv) > 1 else "wheel")
    try:
        lib = ctypes.CDLL(path)
    except OSError as exc:
        sys.exit("cannot load %s: %s" % (path, exc))
    code = ctypes.c_int(0)
    result = lib.ncclGetVersion(ctypes.byref(code))
    if result != 0:
        sys.exit("ncclGetVersion(%s) returned ncclResult_t %d" % (path, result))
    print(json.dumps({"code": code.value, "version": version_string(code.value), "library": loaded_from(path)}))


if __name__ == "__main__":
    main(sys.argv)
