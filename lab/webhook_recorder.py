#!/usr/bin/env python3
"""A webhook receiver for Alertmanager on a lab node (the lab tests' and the benches' stand-in for a pager).

    python3 webhook_recorder.py PORT LOG     (on the node: serves 127.0.0.1:PORT, stdlib only)

Each POST (one Alertmanager notification) becomes one line of LOG: the time it arrived and, per alert, its
name, host label and status. Controller code reads LOG back and asks first_firing() when an alert for a host
first arrived. Only loopback: Alertmanager runs on the same node (the monitoring host).
"""

from __future__ import annotations

import http.server
import json
import sys
import time


def first_firing(log_text, host, after=0.0):
    """(when, sorted alert names) of the first notification at or after `after` with an alert firing for
    host, or None."""
    for line in log_text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        names = sorted({name for name, on, status in entry["alerts"] if on == host and status == "firing"})
        if entry["at"] >= after and names:
            return entry["at"], names
    return None


def main(argv):
    port, log = int(argv[1]), argv[2]

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            alerts = [[a["labels"].get("alertname"), a["labels"].get("host"), a["status"]] for a in body["alerts"]]
            with open(log, "a", encoding="utf-8") as out:
                out.write(json.dumps({"at": time.time(), "alerts": alerts}) + "\n")
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Hook).serve_forever()


if __name__ == "__main__":
    main(sys.argv)
