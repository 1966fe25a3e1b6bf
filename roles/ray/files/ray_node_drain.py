"""Drain one Ray node and wait until nothing runs on it (run on the head by tasks/drain.yml).

argv: dashboard_url gcs_address node_ip token_path deadline_seconds ray_bin reason_message [poll_seconds]

1. Finds the ALIVE Ray node whose IP is node_ip in the state API (/api/v0/nodes?detail=true).
2. Asks the GCS to drain it: `ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION
   --deadline-remaining-seconds N` (a hidden command of Ray's CLI; preemption drains cannot be
   rejected). The scheduler then places no new task or actor there.
3. Polls the state API until no task runs and no actor lives on that node, or the node is no
   longer ALIVE (an idle draining raylet exits by itself), or the deadline passes.

With dashboard_url ``gcs-only`` (the health loop draining the node it runs on, a worker) nothing goes
over HTTP: the node is found and watched through the GCS's gRPC (Ray's own client, with the Ray venv's
Python: TLS with ray_tls, like every channel), and "nothing runs" is read from this node's processes
(a Ray worker's process title is ``ray::<task or actor>``, ``ray::IDLE`` when it waits in the pool). The
dashboard's HTTP carries the token in its Authorization header in clear, so a worker never sends it
across the fabric.

Prints one JSON object on stdout. The token is read from token_path here and is sent only in the
Authorization header (on the head, to its own dashboard) and through RAY_AUTH_TOKEN_PATH: it is never
printed and never passes through Ansible. Standard library only, but for Ray's GCS client in gcs-only.
"""

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

LIMIT = 100
GCS_ONLY = "gcs-only"
# Ray's own processes on a node that are not work: the pool's idle workers (ray::IDLE, ray::IDLE_SpillWorker ...)
# and the node's agents.
NOT_WORK = ("DashboardAgent", "RuntimeEnvAgent")


def get(base, token, path, params=None):
    query = "?" + urllib.parse.urlencode(params, doseq=True) if params else ""
    request = urllib.request.Request(base + path + query, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(request, timeout=10) as answer:
        body = json.loads(answer.read().decode())
    return body["data"]["result"]["result"]


def on_node(base, token, kind, node_id, state):
    params = {
        "filter_keys": ["node_id", "state"],
        "filter_predicates": ["=", "="],
        "filter_values": [node_id, state],
        "limit": LIMIT,
    }
    return get(base, token, "/api/v0/" + kind, params)


def describe(tasks, actors):
    out = ["actor %s %s (pid %s)" % (a.get("class_name") or "?", a.get("actor_id", "")[:12], a.get("pid"))
           for a in actors]
    out += ["task %s %s (%s)" % (t.get("name") or t.get("func_or_class_name") or "?", t.get("task_id", "")[:12],
                                 t.get("type") or "?")
            for t in tasks if t.get("type") != "ACTOR_CREATION_TASK"]
    return out


def work_here(proc_root="/proc"):
    """The Ray tasks and actors this node's processes run, by process title (empty when none)."""
    found = []
    for pid in os.listdir(proc_root):
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, pid, "cmdline"), "rb") as handle:
                title = handle.read().split(b"\0")[0].decode("utf-8", "replace").strip()
        except OSError:
            continue
        if not title.startswith("ray::"):
            continue
        name = (title[5:].split() or [""])[0]
        if name.startswith("IDLE") or name in NOT_WORK:
            continue
        found.append("%s (pid %s)" % (title[:100], pid))
    return sorted(found)


class GcsNodes:
    """The cluster's nodes as the GCS lists them (gRPC, Ray's client): [{node_id, node_ip, state, is_head_node}]."""

    def __init__(self, gcs, token_path):
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path)
        os.environ.pop("RAY_AUTH_TOKEN", None)
        from ray._raylet import GcsClient  # pylint: disable=import-outside-toplevel
        self.client = GcsClient(address=gcs)

    def __call__(self):
        rows = []
        for node_id, info in self.client.get_all_node_info(timeout=10).items():
            rows.append({"node_id": node_id.hex(), "node_ip": info.node_manager_address,
                         "state": type(info).GcsNodeState.Name(info.state), "is_head_node": bool(info.is_head_node)})
        return rows


def main(argv, proc_root="/proc", gcs_nodes=None):
    base, gcs, node_ip, token_path, deadline_s, ray_bin, reason = argv[1:8]
    poll = float(argv[8]) if len(argv) > 8 else 1.0
    deadline_s = int(deadline_s)
    token = ""
    if base == GCS_ONLY:
        # Ray's client reads the token from token_path itself.
        nodes_of = gcs_nodes or GcsNodes(gcs, token_path)
    else:
        with open(token_path) as handle:
            token = handle.read().strip()

        def nodes_of():
            return get(base, token, "/api/v0/nodes", {"detail": "true", "limit": 10000})
    result = {"node_ip": node_ip, "node_id": "", "drained": False, "idle": False, "seconds": 0.0,
              "node_state": "", "still_running": [], "deadline_seconds": deadline_s}

    nodes = nodes_of()
    alive = [n for n in nodes if n.get("node_ip") == node_ip and n.get("state") == "ALIVE"]
    if not alive:
        result["node_state"] = "not an alive node"
        print(json.dumps(result))
        return 0
    node = alive[0]
    if node.get("is_head_node"):
        result["error"] = "%s is the head node; Ray cannot drain the head" % node_ip
        print(json.dumps(result))
        return 2
    node_id = result["node_id"] = node["node_id"]

    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path)
    env.pop("RAY_AUTH_TOKEN", None)
    started = time.monotonic()
    result["accepted_at"] = time.time()
    proc = subprocess.run(
        [ray_bin, "drain-node", "--address", gcs, "--node-id", node_id,
         "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", reason,
         "--deadline-remaining-seconds", str(deadline_s)],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        result["error"] = "ray drain-node exited %d: %s" % (proc.returncode, (proc.stderr or proc.stdout).strip()[-2000:])
        print(json.dumps(result))
        return 1
    result["drained"] = True

    while True:
        state = next((n.get("state") for n in nodes_of() if n.get("node_id") == node_id), "gone")
        if state != "ALIVE":
            result.update(idle=True, node_state=state, still_running=[])
            break
        if base == GCS_ONLY:
            running = work_here(proc_root)
            busy = bool(running)
        else:
            tasks = on_node(base, token, "tasks", node_id, "RUNNING")
            actors = on_node(base, token, "actors", node_id, "ALIVE")
            running, busy = describe(tasks, actors), bool(tasks or actors)
        result.update(node_state=state, still_running=running)
        if not busy:
            result["idle"] = True
            break
        if time.monotonic() - started >= deadline_s:
            break
        time.sleep(poll)
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
