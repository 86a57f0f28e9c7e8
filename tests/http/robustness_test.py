#!/usr/bin/env python3
"""http:// backend robustness: a misbehaving server must give a FAIL row that
names the URL, the request number and the cause, in bounded time -- never a
crash or a hang of the harness.

Usage: robustness_test.py TOUCHSTONE MANIFEST MODEL_GGUF WORKDIR MODE "WORD|WORD..." [ROW]
Runs `touchstone parity --backend http://127.0.0.1:PORT --case one_token
--max-steps 3 --timeout 2` against tests/http/fake_llama_server.py MODE and
checks (MODE "mixed": the serving checks' batch invariance instead of the
case, whose concurrent requests the fake server answers mixed up): exit status 1 (FAIL), within 25 s; the row ROW (default one_token) failed; its failure
text contains every WORD ('{url}' stands for the server's URL); the request
count stayed bounded.
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
touchstone, manifest, model, workdir, mode, words = sys.argv[1:7]
row_name = sys.argv[7] if len(sys.argv) > 7 else "one_token"
os.makedirs(workdir, exist_ok=True)
port_file = os.path.join(workdir, f"{mode}.port")
count_file = os.path.join(workdir, f"{mode}.count")
report = os.path.join(workdir, f"{mode}.json")
for f in (port_file, count_file, report):
    if os.path.exists(f):
        os.remove(f)

N_VOCAB = 49152  # SmolLM2's vocabulary (the golden's n_vocab; the harness checks it)
server = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_llama_server.py"), mode,
                           port_file, model, str(N_VOCAB), count_file, "20"])
try:
    deadline = time.monotonic() + 10
    while not os.path.exists(port_file):
        if time.monotonic() > deadline or server.poll() is not None:
            sys.exit("fake server did not start")
        time.sleep(0.05)
    url = "http://127.0.0.1:" + open(port_file).read().strip()
    t0 = time.monotonic()
    what = ["--case", "one_token", "--max-steps", "3"]
    if mode == "mixed":
        what = ["--serving-only", "--serving-plan", "quick",
                "--serving-check", "serving.batch_invariance"]
    run = subprocess.run([touchstone, "parity", "--backend", url, "--manifest", manifest]
                         + what + ["--weights", "quantized", "--profile", "quantized_int8",
                                   "--timeout", "2", "--json", report],
                         capture_output=True, text=True, timeout=60)
    secs = time.monotonic() - t0
finally:
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=10)

print(run.stdout[-4000:])
print(run.stderr[-2000:], file=sys.stderr)
errors = []
if run.returncode != 1:
    errors.append(f"exit status {run.returncode}, expected 1 (FAIL)")
if secs > 25:
    errors.append(f"took {secs:.1f} s (> 25 s)")
rows = [c for c in json.load(open(report))["cases"] if c["name"] == row_name]
if not rows or rows[0]["passed"]:
    errors.append(f"no failing {row_name} row")
else:
    text = "\n".join(rows[0]["failures"])
    for w in words.split("|"):
        w = w.replace("{url}", url)
        if w not in text:
            errors.append(f"failure text lacks {w!r}: {text!r}")
n = len(open(count_file).read().split()) if os.path.exists(count_file) else 0
limit = 40 if mode == "mixed" else 5  # mixed: the needle's steps alone come first
if n > limit:
    errors.append(f"{n} /completion requests for one failing step")
if errors:
    sys.exit("FAIL: " + "; ".join(errors))
print(f"OK: {mode}: FAIL row names the cause, {secs:.1f} s, {n} /completion requests")
