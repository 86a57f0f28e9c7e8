#!/usr/bin/env python3
"""http.llama_server.parity: a real llama-server judged over HTTP.

Usage: llama_server_parity.py TOUCHSTONE LLAMA_SERVER GGUF WORKDIR [SLOTS]
                              [--drop-grammar ROW] -- PARITY_ARGS...
Starts LLAMA_SERVER on 127.0.0.1 with a free port, -m GGUF, SLOTS parallel
slots (-np, default 1; continuous batching), 1 thread and an 8192-token
context; waits (at most 120 s) for /health; runs
`TOUCHSTONE parity --backend http://127.0.0.1:PORT PARITY_ARGS...`; always
stops the server (also on SIGTERM / SIGINT from CTest's time-out); exits with
touchstone's status. Exit 77 (CTest SKIP) only when LLAMA_SERVER or GGUF is
not there (ci/llamacpp builds llama-server; ci/fetch_models.py fetches GGUF).

--drop-grammar ROW: touchstone talks to a proxy that forwards every request
but removes its 'grammar' and 'json_schema' fields (a server that ignores the
grammar). Then touchstone must FAIL (exit 1) with the report's row ROW failed
(PARITY_ARGS must hold --json PATH); this script exits 0 when it does.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SKIP = 77
touchstone, server_bin, gguf, workdir = sys.argv[1:5]
dash = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
parity_args = sys.argv[dash + 1:]
own = sys.argv[5:dash]
drop_row = None
if "--drop-grammar" in own:
    i = own.index("--drop-grammar")
    drop_row = own[i + 1]
    del own[i:i + 2]
slots = own[0] if own else "1"
for path, why in ((server_bin, "llama-server is not built (run ci/llamacpp)"),
                  (gguf, "the model is not fetched (run ci/fetch_models.py)")):
    if not os.access(path, os.R_OK):
        # In CI ci/bootstrap builds llama-server and fetches the models: missing is a failure.
        print(f"{'FAIL' if os.environ.get('CI') == 'true' else 'SKIP'}: {why}: {path} not found")
        sys.exit(1 if os.environ.get("CI") == "true" else SKIP)
os.makedirs(workdir, exist_ok=True)

with socket.socket() as s:  # a free port (the server binds it right after)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
url = f"http://127.0.0.1:{port}"
log = open(os.path.join(workdir, "llama-server.log"), "w")
server = subprocess.Popen([server_bin, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
                           "-t", "1", "-c", "8192", "-np", slots],
                          stdout=log, stderr=subprocess.STDOUT)


def grammar_dropping_proxy(upstream):
    """A proxy to `upstream` that removes the grammar fields of every request."""
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def forward(self, body):
            req = urllib.request.Request(upstream + self.path, data=body, method=self.command,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    status, answer = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, answer = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def do_GET(self):
            self.forward(None)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            for field in ("grammar", "json_schema"):
                body.pop(field, None)
            self.forward(json.dumps(body).encode())

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{proxy.server_address[1]}"


def expect_failed_row(report_path, row):
    """0 when the report holds a failed row `row`, else a message."""
    rows = [c for c in json.load(open(report_path))["cases"] if c["name"] == row]
    if not rows:
        return f"no row {row} in {report_path}"
    if rows[0]["passed"]:
        return f"row {row} passed with the grammar dropped"
    print(f"OK: {row} failed with the grammar dropped: {rows[0]['failures'][0]}")
    return 0


def stop(*_):
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if _:
        sys.exit(1)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
try:
    deadline = time.monotonic() + 120
    while True:
        if server.poll() is not None:
            sys.exit(f"llama-server exited with {server.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            sys.exit(f"llama-server at {url} not healthy within 120 s; see {log.name}")
        time.sleep(0.25)
    t0 = time.monotonic()
    target = grammar_dropping_proxy(url) if drop_row else url
    rc = subprocess.call([touchstone, "parity", "--backend", target] + parity_args)
    print(f"touchstone parity over HTTP (-np {slots}): exit {rc}, {time.monotonic() - t0:.1f} s")
finally:
    stop()
if drop_row:
    if rc != 1:
        sys.exit(f"FAIL: exit status {rc} with the grammar dropped, expected 1 (FAIL)")
    sys.exit(expect_failed_row(parity_args[parity_args.index("--json") + 1], drop_row))
sys.exit(rc)
