#!/usr/bin/python3
"""A webhook receiver for tests: appends each POST's JSON body as one line to a file.

    webhook-recorder.py PORT FILE

Listens on 127.0.0.1:PORT; answers 200 to every POST. It stands in for the
site's alert receiver (a chat hook, an incident tool) so that a test can read
what Alertmanager delivered.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Recorder(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(sys.argv[2], "a", encoding="utf-8") as handle:
            handle.write(json.dumps(json.loads(body or b"{}"), sort_keys=True) + "\n")
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(sys.argv[1])), Recorder).serve_forever()
