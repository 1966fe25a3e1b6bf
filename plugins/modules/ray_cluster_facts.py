#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module ray_cluster_facts: read a Ray cluster's state from its dashboard REST API."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ray_cluster_facts
short_description: Report the state of a token-authenticated Ray cluster as facts
description:
  - Asks the Ray dashboard REST API of the head node for the Ray version, the GCS health,
    every node (state, IP, resources, labels) and the resources still available, and
    returns them as the C(ray_cluster) fact.
  - Every request carries the token as a C(Bearer) C(Authorization) header; the token is read
    from the file the Ray role writes (mode 0600, owner C(ray)), so run it with C(become).
  - Optionally waits until at least I(wait_for_nodes) nodes are ALIVE, and names the
    expected hosts that are missing, by fabric IP.
  - Read-only; uses only the Python standard library on the managed node.
version_added: "0.1.0"
author:
  - raymetal contributors (@raymetal)
options:
  address:
    description:
      - Dashboard URL, for example C(http://10.231.20.10:8265).
      - Default is C(dashboard_url) from I(config_path).
    type: str
  config_path:
    description:
      - JSON file the Ray role writes on the head (C(dashboard_url), C(gcs_address),
        C(token_path), C(head_unit), C(worker_unit), C(ray_version)).
      - Not needed when I(address) and I(token_path) are both given.
    type: path
    default: /etc/ray/cluster.json
  token_path:
    description:
      - File holding the Ray auth token.
      - Default is C(token_path) from I(config_path), else C(/etc/ray/auth_token).
    type: path
  wait_for_nodes:
    description:
      - Poll until at least this many nodes are ALIVE, for at most I(timeout) seconds.
      - While waiting, a dashboard that does not listen yet, drops a request or fails it (HTTP 5xx, as Ray's
        state API does while the head's GCS is too busy to answer) is asked again within the same I(timeout).
      - C(0) reads the state once without waiting.
    type: int
    default: 0
  expected_nodes:
    description:
      - Inventory hostname to fabric IP of every host that should be a Ray node.
      - Used to name Ray nodes by inventory host and to list the hosts that are missing.
    type: dict
    default: {}
  timeout:
    description:
      - Seconds to wait for I(wait_for_nodes) nodes, and the limit of each HTTP request.
    type: int
    default: 60
  validate_certs:
    description:
      - Verify the TLS certificate when I(address) is C(https://) (a TLS front of the dashboard).
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - raymetal.cluster.attributes
notes:
  - Ray's REST API does not report the operating-system hostname of a node; C(hostname)
    is the inventory name whose fabric IP in I(expected_nodes) matches, else Ray's node name.
  - C(available) comes from the autoscaler's load report, which trails node changes by a few
    seconds; an ALIVE node not in that report yet counts as idle (available = total).
"""

EXAMPLES = r"""
- name: Read the Ray cluster state
  raymetal.cluster.ray_cluster_facts:
  become: true

- name: Wait for every inventory host to join the cluster
  raymetal.cluster.ray_cluster_facts:
    wait_for_nodes: "{{ groups['ray_cluster'] | length }}"
    expected_nodes:
      raymetal-head: 10.231.20.10
      raymetal-worker1: 10.231.20.11
    timeout: 120
  become: true

- name: Ask a dashboard behind a TLS front
  raymetal.cluster.ray_cluster_facts:
    address: https://ray.example.org:8443
    token_path: /etc/ray/auth_token
  become: true
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    ray_cluster:
      description: State of the Ray cluster.
      returned: always
      type: dict
      contains:
        address:
          description: Dashboard URL that was asked.
          type: str
          sample: http://10.231.20.10:8265
        ray_version:
          description: Ray version of the head.
          type: str
          sample: "2.60.0"
        healthy:
          description: Whether C(/api/gcs_healthz) answered C(success).
          type: bool
          sample: true
        nodes_alive:
          description: Number of ALIVE nodes.
          type: int
          sample: 3
        nodes_dead:
          description: Number of entries of C(nodes) that are DEAD (an IP whose last Ray node died and
            has no ALIVE node now). Records of nodes that were replaced by a newer node at the same IP
            are counted in C(earlier_nodes) instead.
          type: int
          sample: 0
        totals:
          description: Sum of the resources of the ALIVE nodes (C(node:*) markers left out).
            Memory figures are bytes.
          type: dict
          sample: {"CPU": 96.0, "GPU": 8.0, "memory": 858993459200.0, "object_store_memory": 214748364800.0}
        available:
          description: Resources not in use on the ALIVE nodes, same keys as C(totals).
          type: dict
          sample: {"CPU": 95.0, "GPU": 7.0, "memory": 858993459200.0, "object_store_memory": 214748364800.0}
        missing:
          description: Inventory hosts of I(expected_nodes) with no ALIVE Ray node at their fabric IP.
          type: list
          elements: str
          sample: ["raymetal-worker2"]
        earlier_nodes:
          description: DEAD node records the GCS keeps for an IP that has a newer node (a node whose Ray
            unit was restarted comes back as a new Ray node). Same fields as C(nodes).
          type: list
          elements: dict
          sample: [{"hostname": "raymetal-worker2", "ip": "10.231.20.12", "state": "DEAD"}]
        nodes:
          description: The current node of each IP, head first. Per IP that is its ALIVE node (or
            nodes), else the DEAD node that started last; older DEAD records at that IP are in
            C(earlier_nodes). So each inventory host appears at most once.
          type: list
          elements: dict
          contains:
            hostname:
              description: Inventory name matched by fabric IP, else Ray's node name.
              type: str
              sample: raymetal-worker1
            ip:
              description: Node IP Ray uses (the fabric IP).
              type: str
              sample: 10.231.20.11
            node_id:
              description: Ray node ID.
              type: str
              sample: 7ecc3b50d0e63072f533b566f2118a777b8dc60f974add65d1798f80
            is_head:
              description: Whether this is the head node.
              type: bool
              sample: false
            state:
              description: C(ALIVE) or C(DEAD).
              type: str
              sample: ALIVE
            state_message:
              description: Why a node is DEAD, as Ray reports it.
              type: str
              sample: "Expected termination: received SIGTERM"
            resources:
              description: Total resources of the node (C(node:*) markers left out).
              type: dict
              sample: {"CPU": 32.0, "GPU": 4.0, "memory": 286331153408.0, "object_store_memory": 71582788403.0}
            available:
              description: Resources not in use on the node (empty for DEAD nodes).
              type: dict
              sample: {"CPU": 31.0, "GPU": 3.0, "memory": 286331153408.0, "object_store_memory": 71582788403.0}
            labels:
              description: Node labels.
              type: dict
              sample: {"ray.io/node-id": "7ecc3b50d0e63072f533b566f2118a777b8dc60f974add65d1798f80", "rack": "r2"}
"""

import json
import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib import error as urllib_error
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url

DEFAULT_TOKEN_PATH = "/etc/ray/auth_token"
DEFAULT_HEAD_UNIT = "ray-head.service"
DEFAULT_WORKER_UNIT = "ray-worker.service"
PATH_VERSION = "/api/version"
PATH_HEALTH = "/api/gcs_healthz"
PATH_NODES = "/api/v0/nodes?detail=true"
PATH_STATUS = "/api/cluster_status"
SHOW_MAX = 300


# How often the wait asks the GCS (through the dashboard) for the node list again.
POLL_SECONDS = 0.5


class RayFactsError(Exception):
    """A failure with one message meant for the user."""


class NotListening(RayFactsError):
    """Nothing listens on the dashboard port (yet): the head unit is down or starting."""


class ServerBusy(NotListening):
    """The dashboard answered 5xx: it listens, but failed this request (its GCS or its own workers too busy, or
    still starting). While waiting for the nodes it is asked again, as one that does not listen yet is."""


def _short(text):
    text = text if isinstance(text, str) else repr(text)
    return text if len(text) <= SHOW_MAX else text[:SHOW_MAX] + "... (%d chars in all)" % len(text)


def read_config(path, required):
    """Return the Ray role's cluster.json as a dict ({} when absent and not required)."""
    try:
        with open(path, "r") as fh:
            raw = fh.read()
    except FileNotFoundError:
        if required:
            raise RayFactsError(
                "%s does not exist and no address was given: apply the Ray role to this host "
                "(it writes that file on the head) or pass address and token_path" % path)
        return {}
    except OSError as err:
        raise RayFactsError("cannot read %s: %s" % (path, err.strerror))
    try:
        config = json.loads(raw)
    except ValueError:
        raise RayFactsError("%s is not JSON; it holds: %s" % (path, _short(raw)))
    if not isinstance(config, dict):
        raise RayFactsError("%s must hold a JSON object; it holds: %s" % (path, _short(raw)))
    return config


def _describe_file(path):
    try:
        st = os.stat(path)
    except OSError:
        return "unknown owner and mode"
    try:
        import pwd
        owner = pwd.getpwuid(st.st_uid).pw_name
    except (ImportError, KeyError):
        owner = str(st.st_uid)
    return "owner %s, mode %04o" % (owner, st.st_mode & 0o7777)


def read_token(path):
    """Return the token in path, or raise RayFactsError naming path, owner, mode and our uid."""
    if not os.path.exists(path):
        raise RayFactsError(
            "Ray auth token file %s does not exist: the Ray role writes it on every node "
            "(owner ray, mode 0600); set token_path if it lives elsewhere" % path)
    try:
        with open(path, "r") as fh:
            token = fh.read().strip()
    except OSError as err:
        raise RayFactsError(
            "cannot read Ray auth token file %s (%s; this task runs as uid %d): %s. "
            "Run the task with become: true" % (path, _describe_file(path), os.geteuid(), err.strerror))
    if not token:
        raise RayFactsError("Ray auth token file %s is empty (%s)" % (path, _describe_file(path)))
    return token


class RayApi(object):
    """Minimal client of the Ray dashboard REST API (ansible.module_utils.urls.open_url)."""

    def __init__(self, address, token, timeout, validate_certs=True, head_unit=DEFAULT_HEAD_UNIT):
        self.address = address.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.head_unit = head_unit
        self.validate_certs = validate_certs

    def get(self, path):
        """GET path; return (status, body text). HTTP errors other than 401/403 come back as status."""
        url = self.address + path
        try:
            resp = open_url(url, method="GET", timeout=self.timeout, validate_certs=self.validate_certs,
                            headers={"Authorization": "Bearer " + self.token, "Accept": "application/json"},
                            http_agent="raymetal-ray_cluster_facts")
            try:
                return resp.getcode(), resp.read().decode("utf-8", "replace")
            finally:
                resp.close()
        except urllib_error.HTTPError as err:
            body = err.read().decode("utf-8", "replace")
            if err.code == 401:
                raise RayFactsError(
                    "%s answered 401 Unauthorized (%s): Ray wants a token and none was accepted; "
                    "check that the head runs with RAY_AUTH_MODE=token and that the token file "
                    "is not empty" % (url, _short(body.strip())))
            if err.code == 403:
                raise RayFactsError(
                    "%s answered 403 Forbidden (%s): the token in the token file is not the "
                    "cluster's token (token_path, or the token the head was started with, is "
                    "wrong or stale: a new token needs a restart of every Ray unit)"
                    % (url, _short(body.strip())))
            return err.code, body
        except (socket.timeout, TimeoutError):
            raise RayFactsError("%s did not answer within %d s: is %s overloaded or hung? "
                                "See journalctl -u %s -n 50" % (url, self.timeout, self.head_unit,
                                                                self._unit_short()))
        except urllib_error.URLError as err:
            reason = err.reason
            if isinstance(reason, ConnectionRefusedError) or "refused" in str(reason).lower():
                raise NotListening(
                    "connection refused at %s: the Ray dashboard is not listening, so %s is "
                    "probably not running. Check systemctl status %s and journalctl -u %s -n 50"
                    % (url, self.head_unit, self.head_unit, self._unit_short()))
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise RayFactsError("%s did not answer within %d s" % (url, self.timeout))
            raise RayFactsError("cannot reach %s: %s" % (url, reason))
        except ConnectionResetError as err:
            # http.client.RemoteDisconnected included: the dashboard accepted the connection and
            # dropped it, as it does while it (re)starts right after the head unit restarted.
            raise NotListening("%s closed the connection without an answer (%s): the Ray dashboard is "
                               "probably (re)starting; check systemctl status %s"
                               % (url, err, self.head_unit))
        except (OSError, ValueError, UrlsConnectionError) as err:
            # UrlsConnectionError: open_url's own failures (SSLValidationError included).
            raise RayFactsError("cannot reach %s: %s" % (url, err))

    def _unit_short(self):
        return self.head_unit[:-len(".service")] if self.head_unit.endswith(".service") else self.head_unit

    def get_json(self, path):
        """GET path and return its JSON; raise RayFactsError on non-200 or non-JSON answers."""
        status, body = self.get(path)
        if status >= 500:
            raise ServerBusy("%s%s answered HTTP %d: %s (the dashboard is up but failed the request: is %s "
                             "overloaded? See journalctl -u %s -n 50)"
                             % (self.address, path, status, _short(body), self.head_unit, self._unit_short()))
        if status != 200:
            raise RayFactsError("%s%s answered HTTP %d: %s" % (self.address, path, status, _short(body)))
        try:
            return json.loads(body)
        except ValueError:
            raise RayFactsError("%s%s did not answer JSON; received: %s" % (self.address, path, _short(body)))


def _unexpected(path, payload, what):
    return RayFactsError("unexpected JSON from %s (%s); received: %s"
                         % (path, what, _short(json.dumps(payload, sort_keys=True))))


def parse_version(payload):
    if not isinstance(payload, dict) or not isinstance(payload.get("ray_version"), str):
        raise _unexpected(PATH_VERSION, payload, "no ray_version string")
    return payload["ray_version"]


def parse_nodes(payload):
    """Return the node list of /api/v0/nodes?detail=true, each checked for the fields we use."""
    try:
        nodes = payload["data"]["result"]["result"]
    except (KeyError, TypeError):
        raise _unexpected(PATH_NODES, payload, "no data.result.result list")
    if not isinstance(nodes, list):
        raise _unexpected(PATH_NODES, payload, "data.result.result is not a list")
    for node in nodes:
        if not isinstance(node, dict) or not all(k in node for k in ("node_id", "node_ip", "state")):
            raise _unexpected(PATH_NODES, payload, "a node lacks node_id, node_ip or state")
    return nodes


def parse_usage(payload):
    """Return {node_id: {resource: [used, total]}} from /api/cluster_status ({} if not reported yet)."""
    try:
        data = payload["data"]
    except (KeyError, TypeError):
        raise _unexpected(PATH_STATUS, payload, "no data object")
    status = (data or {}).get("clusterStatus") or {}
    report = status.get("loadMetricsReport") or {}
    usage = report.get("usageByNode") or {}
    if not isinstance(usage, dict):
        raise _unexpected(PATH_STATUS, payload, "loadMetricsReport.usageByNode is not an object")
    return usage


def _norm(name):
    # The dashboard camel-cases resource names (object_store_memory -> objectStoreMemory,
    # fabric_ib -> fabricIb); compare them case- and underscore-blind.
    return name.replace("_", "").lower()


def _resources(raw):
    return dict((k, v) for k, v in sorted((raw or {}).items()) if not k.startswith("node:"))


def node_available(resources, usage):
    """Available resources of one node: total minus used, names mapped back to Ray's own."""
    if usage is None:
        return dict(resources)
    by_norm = dict((_norm(k), v) for k, v in usage.items())
    available = {}
    for name, total in resources.items():
        pair = by_norm.get(_norm(name))
        if isinstance(pair, list) and len(pair) == 2:
            available[name] = max(float(pair[1]) - float(pair[0]), 0.0)
        else:
            available[name] = total
    return available


def _add(into, resources):
    for name, value in resources.items():
        into[name] = into.get(name, 0.0) + float(value)


def _entry(node, by_ip, usage):
    state = node.get("state")
    resources = _resources(node.get("resources_total"))
    entry = {
        "hostname": by_ip.get(node["node_ip"], node.get("node_name") or node["node_ip"]),
        "ip": node["node_ip"],
        "node_id": node["node_id"],
        "is_head": bool(node.get("is_head_node")),
        "state": state,
        "state_message": node.get("state_message") or "",
        "resources": resources,
        "available": {},
        "labels": node.get("labels") or {},
    }
    if state == "ALIVE":
        entry["available"] = node_available(resources, usage.get(node["node_id"]))
    return entry


def current_and_earlier(nodes):
    """Split the GCS's node records into each IP's current node(s) and the earlier, replaced ones.

    A node that restarts (its unit was stopped and started again) comes back as a
    new Ray node at the same IP; the GCS keeps the old record as DEAD. Per IP, the
    current nodes are the ALIVE ones, else the DEAD one that started last; every
    other DEAD record at that IP is an earlier node.
    """
    by_ip = {}
    for node in nodes:
        by_ip.setdefault(node["node_ip"], []).append(node)
    current, earlier = [], []
    for records in by_ip.values():
        alive = [n for n in records if n.get("state") == "ALIVE"]
        if alive:
            keep = alive
        else:
            keep = [max(records, key=lambda n: (n.get("start_time_ms") or 0, n.get("end_time_ms") or 0))]
        current.extend(keep)
        earlier.extend(n for n in records if not any(n is k for k in keep))
    return current, earlier


def build_facts(address, version, healthy, nodes, usage, expected):
    """Turn parsed API answers into the ray_cluster fact."""
    by_ip = dict((str(ip), host) for host, ip in (expected or {}).items())
    current, earlier = current_and_earlier(nodes)
    out_nodes = [_entry(node, by_ip, usage) for node in current]
    out_earlier = [_entry(node, by_ip, usage) for node in earlier]
    totals, available = {}, {}
    for entry in out_nodes:
        if entry["state"] == "ALIVE":
            _add(totals, entry["resources"])
            _add(available, entry["available"])
    alive_ips = set(n["ip"] for n in out_nodes if n["state"] == "ALIVE")
    out_nodes.sort(key=lambda n: (not n["is_head"], n["state"] != "ALIVE", n["hostname"], n["ip"]))
    out_earlier.sort(key=lambda n: (n["hostname"], n["ip"], n["node_id"]))
    missing = sorted(host for host, ip in (expected or {}).items() if str(ip) not in alive_ips)
    return {
        "address": address,
        "ray_version": version,
        "healthy": healthy,
        "nodes_alive": sum(1 for n in out_nodes if n["state"] == "ALIVE"),
        "nodes_dead": sum(1 for n in out_nodes if n["state"] == "DEAD"),
        "totals": totals,
        "available": available,
        "missing": missing,
        "nodes": out_nodes,
        "earlier_nodes": out_earlier,
    }


def missing_message(nodes, wanted, expected, waited, worker_unit=DEFAULT_WORKER_UNIT):
    """The one message for a wait that ran out."""
    alive = [n for n in nodes if n.get("state") == "ALIVE"]
    alive_ips = set(n["node_ip"] for n in alive)
    msg = "timed out after %d s waiting for %d ALIVE Ray nodes; %d alive (%s)" % (
        waited, wanted, len(alive), ", ".join(sorted(alive_ips)) or "none")
    if expected:
        gone = ["%s (%s)" % (host, ip) for host, ip in sorted(expected.items()) if str(ip) not in alive_ips]
        if gone:
            msg += ". Missing hosts, by fabric IP: " + ", ".join(gone)
            msg += ". On each, check systemctl status %s and journalctl -u %s -n 50" % (
                worker_unit, worker_unit[:-len(".service")] if worker_unit.endswith(".service") else worker_unit)
    dead = sorted(set(n["node_ip"] for n in nodes if n.get("state") == "DEAD") - alive_ips)
    if dead:
        msg += ". DEAD in the GCS: " + ", ".join(dead)
    return msg


def _read(api, path, parse, wait, timeout, sleep, clock):
    """parse(the JSON at path); when wait is true, a dashboard that does not listen yet (the head unit was just
    started), drops the request or fails it (5xx) is asked again every second for up to timeout seconds."""
    start = clock()
    while True:
        try:
            return parse(api.get_json(path))
        except NotListening as err:
            waited = clock() - start
            if not wait or waited >= timeout:
                raise RayFactsError("%s%s" % (err, " (waited %d s)" % waited if wait else ""))
            sleep(min(1.0, max(timeout - waited, 0.1)))


def read_version(api, wait, timeout, sleep=time.sleep, clock=time.monotonic):
    """The API's version answer (see _read for the wait)."""
    return _read(api, PATH_VERSION, parse_version, wait, timeout, sleep, clock)


def read_usage(api, wait, timeout, sleep=time.sleep, clock=time.monotonic):
    """The cluster's resource usage (see _read for the wait)."""
    return _read(api, PATH_STATUS, parse_usage, wait, timeout, sleep, clock)


def fetch_nodes(api, wanted, timeout, expected, sleep=time.sleep, clock=time.monotonic,
                worker_unit=DEFAULT_WORKER_UNIT):
    """Return the node list, polling until `wanted` nodes are ALIVE (0: no wait)."""
    start = clock()
    while True:
        try:
            nodes = parse_nodes(api.get_json(PATH_NODES))
        except NotListening as err:
            # Waiting for the nodes: a dashboard that drops or fails (5xx) a request while it restarts, or while
            # its GCS is too busy to answer it, is asked again.
            waited = clock() - start
            if not wanted or waited >= timeout:
                raise RayFactsError("%s%s" % (err, " (waited %d s)" % waited if wanted else ""))
            sleep(min(POLL_SECONDS, max(timeout - waited, 0.1)))
            continue
        if sum(1 for n in nodes if n.get("state") == "ALIVE") >= wanted:
            return nodes
        if clock() - start >= timeout:
            raise RayFactsError(missing_message(nodes, wanted, expected, timeout, worker_unit))
        sleep(min(POLL_SECONDS, max(timeout - (clock() - start), 0.1)))


def gather(params, api_factory=RayApi, sleep=time.sleep, clock=time.monotonic):
    """Read config and token, ask the API, return the ray_cluster fact (raises RayFactsError)."""
    config = read_config(params["config_path"], required=not params.get("address"))
    address = params.get("address") or config.get("dashboard_url")
    if not address:
        raise RayFactsError("%s has no dashboard_url and no address was given" % params["config_path"])
    token_path = params.get("token_path") or config.get("token_path") or DEFAULT_TOKEN_PATH
    token = read_token(token_path)
    head_unit = config.get("head_unit") or DEFAULT_HEAD_UNIT
    api = api_factory(address, token, params["timeout"], params["validate_certs"], head_unit)
    expected = params.get("expected_nodes") or {}

    version = read_version(api, params["wait_for_nodes"] > 0, params["timeout"], sleep, clock)
    nodes = fetch_nodes(api, params["wait_for_nodes"], params["timeout"], expected, sleep, clock,
                        config.get("worker_unit") or DEFAULT_WORKER_UNIT)
    health_status, health_body = api.get(PATH_HEALTH)
    healthy = health_status == 200 and health_body.strip() == "success"
    usage = read_usage(api, params["wait_for_nodes"] > 0, params["timeout"], sleep, clock)
    return build_facts(api.address, version, healthy, nodes, usage, expected)


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            address=dict(type="str"),
            config_path=dict(type="path", default="/etc/ray/cluster.json"),
            token_path=dict(type="path", no_log=False),
            wait_for_nodes=dict(type="int", default=0),
            expected_nodes=dict(type="dict", default={}),
            timeout=dict(type="int", default=60),
            validate_certs=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    params = module.params
    if params["wait_for_nodes"] < 0 or params["timeout"] < 1:
        module.fail_json(msg="wait_for_nodes must be >= 0 and timeout >= 1; got %d and %d"
                         % (params["wait_for_nodes"], params["timeout"]))
    try:
        facts = gather(params)
    except RayFactsError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, ansible_facts={"ray_cluster": facts})


if __name__ == "__main__":
    main()
