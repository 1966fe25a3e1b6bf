"""``python -m raymetal status -i inventory/<site>``: the cluster's state, and an exit status a script can act on.

Runs playbooks/status.yml (read-only) through :func:`raymetal.runner.status`, prints one line per node that is out
of the cluster and why, and exits with:

  0  every inventory host is an ALIVE Ray node
  2  some inventory host is not an ALIVE Ray node (named), the head could not be asked, or the S3 store
     (raymetal_shared_storage kind s3) does not answer (named)
  3  every host is alive or quarantined, and at least one worker is quarantined by the health loop (named, with its
     class and check): ansible-playbook has one code (2) for both cases, this tells them apart
  4  the head is unreachable over SSH
  1  the run failed otherwise (the message says why)
"""

from __future__ import annotations

import argparse
import sys

from raymetal.runner import RaymetalError, status

OK, MISSING, QUARANTINED, UNREACHABLE, FAILED = 0, 2, 3, 4, 1


def verdict(cluster):
    """(exit status, lines) for a ray_cluster fact from status()."""
    lines = ["%d node(s) alive at %s" % (cluster.get("nodes_alive", 0), cluster.get("address", "?"))]
    missing = list(cluster.get("missing") or [])
    left_out = dict(cluster.get("left_out") or {})
    quarantined = dict((h, why) for h, why in left_out.items() if str(why).startswith("quarantined"))
    lines += ["%s: not an ALIVE Ray node" % host for host in missing]
    lines += ["%s: %s" % (host, why) for host, why in sorted(left_out.items())]
    store_down = cluster.get("storage_answers") is False
    if store_down:
        lines.append("the S3 store at %s does not answer: checkpoints to %s fail until it does"
                     % (cluster.get("storage_endpoint") or "?", cluster.get("storage_path") or "?"))
    if missing or store_down:
        return MISSING, lines
    if quarantined:
        return QUARANTINED, lines
    return OK, lines


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m raymetal", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    status_parser = sub.add_parser("status", help="the cluster's state and a distinct exit status per case")
    status_parser.add_argument("-i", "--inventory", required=True, help="the site's inventory (inventory/<site>)")
    args = parser.parse_args(argv)
    try:
        cluster = status(args.inventory)
    except RaymetalError as err:
        print("raymetal status: %s" % err, file=sys.stderr)
        unreachable = any(f.get("unreachable") for f in err.failures)
        return UNREACHABLE if err.rc == 4 or unreachable else (MISSING if err.rc == 2 else FAILED)
    code, lines = verdict(cluster)
    print("\n".join(lines))
    return code


if __name__ == "__main__":
    sys.exit(main())
