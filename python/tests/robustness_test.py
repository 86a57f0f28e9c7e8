#!/usr/bin/env python3
"""`touchstone parity` on a misbehaving exec: child (misbehaving_child.py): the
harness, not the child, writes the verdict: exit status 1, a complete JSON and
JUnit report with every case, the broken case's row naming the cause, nothing
of the child's on stdout, no child left running, and no hang.

usage: robustness_test.py TOUCHSTONE MANIFEST OUT_DIR MODE EXPECT [PYTHON]
  EXPECT: text the broken case's failure lines must contain ("*" = every case's).
"""
import glob
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ["one_token", "narrative", "arithmetic"]
TIMEOUT_S = 5  # per call: the hang mode is killed after it


def children_left(marker):
    left = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(path, "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    left.append(int(path.split("/")[2]))
        except OSError:
            pass
    return left


def main():
    touchstone, manifest, out, mode, expect = sys.argv[1:6]
    python = sys.argv[6] if len(sys.argv) > 6 else sys.executable
    os.makedirs(out, exist_ok=True)
    state = os.path.join(out, f"{mode}.state")
    rj, rx = os.path.join(out, f"{mode}.json"), os.path.join(out, f"{mode}.xml")
    for old in (state, rj, rx):
        if os.path.exists(old):
            os.remove(old)
    marker = f"TOUCHSTONE_PY_ROBUSTNESS={state}"
    env = dict(os.environ, TOUCHSTONE_PY_ROBUSTNESS=state)
    backend = f"exec:{python} {os.path.join(HERE, 'misbehaving_child.py')} {mode} {state}"
    cmd = [touchstone, "parity", "--backend", backend, "--manifest", manifest, "--json", rj,
           "--junit", rx, "--timeout", str(TIMEOUT_S), "--max-steps", "3",
           # greedy "tolerance": a wrong token does not end the case, so decode is called
           "--profile", "quantized"]
    for c in CASES:
        cmd += ["--case", c]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    took = time.time() - t0
    stdout = p.stdout.decode(errors="replace")
    print(stdout)
    print(p.stderr.decode(errors="replace"), file=sys.stderr)
    errors = []
    if p.returncode != 1:
        errors.append(f"exit status {p.returncode}, expected 1")
    if "verdict: FAIL" not in stdout:
        errors.append("no 'verdict: FAIL' line in the table")
    if "misbehaving child" in stdout:
        errors.append("the child's output reached the harness's stdout")
    with open(rj, encoding="utf-8") as f:
        report = json.load(f)
    ET.parse(rx)
    if not report["complete"]:
        errors.append("report not marked complete")
    names = [c["name"] for c in report["cases"]]
    if names != CASES:
        errors.append(f"report has cases {names}, expected {CASES}")
    broken = report["cases"] if expect.startswith("*") else report["cases"][1:2]
    text = expect.lstrip("*")
    for c in broken:
        if c["passed"] or not any(text in f for f in c["failures"]):
            errors.append(f"case {c['name']}: no failure mentions {text!r}: {c['failures']}")
    if not expect.startswith("*") and text:
        for c in report["cases"][0:1] + report["cases"][2:]:
            if any(text in f for f in c["failures"]):
                errors.append(f"case {c['name']} (not the broken one) mentions {text!r}")
    for _ in range(50):
        left = children_left(marker)
        if not left:
            break
        time.sleep(0.1)
    if left:
        errors.append(f"child processes outlived the harness: {left}")
    if errors:
        print("\n".join("FAILED: " + e for e in errors))
        return 1
    print(f"misbehaving child '{mode}': complete report, FAIL row names the cause, exit 1 "
          f"({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
