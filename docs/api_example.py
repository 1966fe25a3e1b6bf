"""Read the state of a raymetal cluster from Python (run from the repository root)."""

import sys

from raymetal.runner import RaymetalError, status

inventory = sys.argv[1] if len(sys.argv) > 1 else "inventory/lab"


def show(event):
    if event["status"] in ("failed", "unreachable"):
        print("  %s on %s: %s" % (event["task"], event["host"], event["status"]))


try:
    cluster = status(inventory, on_event=show)
except RaymetalError as err:
    for failure in err.failures:
        print("FAILED %(host)s, task %(task)s: %(msg)s" % failure)
    sys.exit(1)

print("Ray %s: %d nodes alive, %d GPUs" % (
    cluster["ray_version"], cluster["nodes_alive"], cluster["totals"].get("GPU", 0)))
for node in cluster["nodes"]:
    print("  %-20s %-15s %s" % (node["hostname"], node["ip"], node["state"]))
