"""The lab nodes' bytecode cache for Ansible's module payloads (lab only).

Ansible runs every module on a node as a zip of Python sources (AnsiballZ)
that Python imports with zipimport, which cannot keep compiled bytecode: on a
lab node about 0.25 of the 0.4 CPU-second a module costs is compiling
ansible.module_utils again, for every task on every node. The lab's nodes are
containers sharing the test machine's two cores, so the suite pays that on
every task. This hook, loaded by the system Python through a .pth file in the
lab image only, keeps the compiled code of each payload source in
/var/cache/raymetal-lab-bytecode, keyed by the source's digest and Python's
version: the same source gives the same code object, so what runs is what
Ansible sent. raymetal installs nothing like it on real nodes, and the
benchmarks run without it (LAB_BYTECODE_CACHE=0, see lab/lab.sh).

Only zips named like Ansible's payloads are cached, only for root (the cache
is root's and 0700), and any failure falls back to compiling.
"""

import os
import sys

CACHE = "/var/cache/raymetal-lab-bytecode"


def _install(cache=CACHE):
    # Root's cache only, in a directory no one else may write: it holds code root runs.
    if os.geteuid() != 0:
        return
    try:
        st = os.stat(cache)
    except OSError:
        return
    if st.st_uid != 0 or st.st_mode & 0o077:
        return
    import zipimport

    compile_source = zipimport._compile_source

    def _renamed(code, pathname):
        consts = tuple(_renamed(c, pathname) if hasattr(c, "co_filename") else c for c in code.co_consts)
        return code.replace(co_filename=pathname, co_consts=consts)

    def cached_compile(pathname, source):
        if "_payload.zip" not in pathname or "/ansible_" not in pathname:
            return compile_source(pathname, source)
        try:
            import hashlib
            import marshal

            path = os.path.join(cache, f"{sys.implementation.cache_tag}-{hashlib.sha256(source).hexdigest()}")
            try:
                with open(path, "rb") as f:
                    return _renamed(marshal.loads(f.read()), pathname)
            except Exception:  # missing or unreadable: compiled again and stored below
                pass
            code = compile_source(pathname, source)
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(marshal.dumps(code))
            os.replace(tmp, path)
            return code
        except Exception:  # a cache that fails must never fail the module
            return compile_source(pathname, source)

    zipimport._compile_source = cached_compile


try:
    _install()
except Exception:  # never in the way of the node's Python
    pass
