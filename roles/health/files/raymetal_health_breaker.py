"""The health loop's circuit breaker (issue 36): quarantine slots in the GCS's key-value store.

    <Ray venv python> raymetal_health_breaker.py claim|release|settle --gcs IP:PORT --token-path P
        --host NAME --limit K --window-s S [--finding TEXT] [--now T]

Run by raymetal_health_agent.py, as root, with Ray's venv Python (it needs Ray's GCS client), on a worker
whose loop found a FAIL. At most ``limit`` workers of the cluster hold a quarantine slot, a key
``raymetal/health/quarantine/<i>`` (i < limit) in the GCS's internal key-value store (namespace
``raymetal``), so every worker's loop sees the same count without the controller:

- ``claim``: takes the first free slot with a put that never overwrites (the GCS adds a key only when it is
  absent, so two workers that claim at once never get the same slot), or finds the slot this host already
  holds. Prints ``{"granted": true, "slot": i}``, or ``{"granted": false, "holders": [...]}`` when every
  slot is held: the breaker is open and the loop quarantines nothing more.
- ``release``: at re-admission. With ``window_s`` 0 the slot is deleted; else it is marked released and
  stays held ``window_s`` seconds more, so that at most ``limit`` quarantines begin in any window (a
  flapping fault cannot cycle every worker through the slots). Prints ``{"free_at": t}``.
- ``settle``: releases this host's slots that a failed ``release`` left held, and deletes them once their
  window has passed. Prints ``{"free_at": t}`` (None when none is left).

Only the host named in a slot writes or deletes it. The token is read from the file in
RAY_AUTH_TOKEN_PATH (never argv). Exits 0 with the JSON line, 1 when the GCS cannot be asked (the loop then
quarantines nothing: a breaker that cannot be read is open).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

NAMESPACE = b"raymetal"
PREFIX = "raymetal/health/quarantine/"


def slot_key(index):
    return (PREFIX + str(index)).encode()


def read(client, index):
    raw = client.internal_kv_get(slot_key(index), NAMESPACE)
    if raw is None:
        return None
    try:
        return json.loads(raw.decode())
    except ValueError:
        return {"host": "?", "raw": raw.decode(errors="replace")}


def claim(client, host, limit, finding, now):
    holders = []
    for index in range(limit):
        value = {"host": host, "since": now, "finding": finding[:200]}
        if client.internal_kv_put(slot_key(index), json.dumps(value).encode(), False, NAMESPACE) == 1:
            return {"granted": True, "slot": index}
        held = read(client, index)
        if held is None:
            # Deleted between the put and the read: try it once more.
            if client.internal_kv_put(slot_key(index), json.dumps(value).encode(), False, NAMESPACE) == 1:
                return {"granted": True, "slot": index}
            held = read(client, index) or {"host": "?"}
        if held.get("host") == host:
            if "released_at" in held:
                # Quarantined again within its window: the place is held again, not freed when the window ends.
                del held["released_at"]
                client.internal_kv_put(slot_key(index), json.dumps(held).encode(), True, NAMESPACE)
            return {"granted": True, "slot": index, "already": True}
        holders.append(held)
    return {"granted": False, "limit": limit, "holders": holders}


def mine(client, host, limit):
    for index in range(limit):
        held = read(client, index)
        if held and held.get("host") == host:
            yield index, held


def release(client, host, limit, window_s, now):
    free_at = now
    for index, held in mine(client, host, limit):
        if window_s <= 0:
            client.internal_kv_del(slot_key(index), False, NAMESPACE)
        else:
            held["released_at"] = now
            client.internal_kv_put(slot_key(index), json.dumps(held).encode(), True, NAMESPACE)
            free_at = now + window_s
    return {"free_at": free_at}


def settle(client, host, limit, window_s, now):
    """After a re-admission: this host's places released (if a release did not get through) and deleted once
    their window has passed; free_at says when the next is due (None: nothing left)."""
    free_at = None
    for index, held in mine(client, host, limit):
        if "released_at" not in held:
            held["released_at"] = now
            client.internal_kv_put(slot_key(index), json.dumps(held).encode(), True, NAMESPACE)
        due = float(held["released_at"]) + window_s
        if now >= due:
            client.internal_kv_del(slot_key(index), False, NAMESPACE)
        else:
            free_at = due if free_at is None else max(free_at, due)
    return {"free_at": free_at}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("action", choices=["claim", "release", "settle"])
    parser.add_argument("--gcs", required=True)
    parser.add_argument("--token-path", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--window-s", type=float, default=0.0)
    parser.add_argument("--finding", default="")
    parser.add_argument("--now", type=float, default=None, help="the loop's clock (default: this host's)")
    args = parser.parse_args(argv)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=args.token_path)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    try:
        from ray._raylet import GcsClient  # pylint: disable=import-outside-toplevel

        client = GcsClient(address=args.gcs)
        now = time.time() if args.now is None else args.now
        if args.action == "claim":
            result = claim(client, args.host, args.limit, args.finding, now)
        elif args.action == "release":
            result = release(client, args.host, args.limit, args.window_s, now)
        else:
            result = settle(client, args.host, args.limit, args.window_s, now)
    except Exception as exc:  # noqa: BLE001  (any failure to reach the GCS: the loop must not quarantine)
        print(json.dumps({"error": "%s: %s" % (type(exc).__name__, str(exc)[:300])}))
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
