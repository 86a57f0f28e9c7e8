#!/usr/bin/env python3
"""http.llama_server.parity: a real llama-server judged over HTTP.

Usage: llama_server_parity.py TOUCHSTONE LLAMA_SERVER GGUF WORKDIR [SLOTS] -- PARITY_ARGS...
Starts LLAMA_SERVER on 127.0.0.1 with a free port, -m GGUF, SLOTS parallel
slots (-np, default 1; continuous batching), 1 thread and an 8192-token
context; waits (at most 120 s) for /health; runs
`TOUCHSTONE parity --backend http://127.0.0.1:PORT PARITY_ARGS...`; always
stops the server (also on SIGTERM / SIGINT from CTest's time-out); exits with
touchstone's status. Exit 77 (CTest SKIP) only when LLAMA_SERVER or GGUF is
not there (ci/llamacpp builds llama-server; ci/fetch_models.py fetches GGUF).
"""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

SKIP = 77
touchstone, server_bin, gguf, workdir = sys.argv[1:5]
dash = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
parity_args = sys.argv[dash + 1:]
slots = sys.argv[5] if dash > 5 else "1"
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
    rc = subprocess.call([touchstone, "parity", "--backend", url] + parity_args)
    print(f"touchstone parity over HTTP (-np {slots}): exit {rc}, {time.monotonic() - t0:.1f} s")
finally:
    stop()
sys.exit(rc)
