#!/usr/bin/env python3
"""Runs `touchstone parity` on a deliberately misbehaving backend and checks
that the harness, not the backend, writes the verdict: a complete JSON and
JUnit report, the broken case FAIL with a row naming the cause, the cases
around it judged normally, exit status 1.

usage: bad_backend_test.py TOUCHSTONE BAD_BACKEND_LIB MANIFEST OUT_DIR MODE EXPECT
  EXPECT: text the failing case's failure line must contain.
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

CASES = ["one_token", "narrative", "arithmetic"]


def main():
    touchstone, lib, manifest, out, mode, expect = sys.argv[1:7]
    os.makedirs(out, exist_ok=True)
    state = os.path.join(out, f"{mode}.state")
    if os.path.exists(state):
        os.remove(state)
    rj, rx = os.path.join(out, f"{mode}.json"), os.path.join(out, f"{mode}.xml")
    env = dict(os.environ, TOUCHSTONE_BAD_MODE=mode, TOUCHSTONE_BAD_STATE=state)
    cmd = [touchstone, "parity", "--backend", lib, "--manifest", manifest, "--json", rj,
           "--junit", rx, "--timeout", "20"]
    for c in CASES:
        cmd += ["--case", c]
    p = subprocess.run(cmd, env=env, capture_output=True, timeout=600)
    out_text = p.stdout.decode(errors="replace")
    print(out_text)
    print(p.stderr.decode(errors="replace"), file=sys.stderr)
    errors = []
    if p.returncode != 1:
        errors.append(f"exit status {p.returncode}, expected 1")
    if "verdict: FAIL" not in out_text:
        errors.append("no 'verdict: FAIL' line in the table")
    with open(rj, encoding="utf-8") as f:  # must be valid UTF-8 JSON
        report = json.load(f)
    ET.parse(rx)  # must be well-formed XML
    if not report["complete"]:
        errors.append("report not marked complete")
    names = [c["name"] for c in report["cases"]]
    if names != CASES:
        errors.append(f"report has cases {names}, expected {CASES}")
    every_case_fails = mode in ("n_vocab", "names")
    for i, c in enumerate(report["cases"]):
        should_pass = not every_case_fails and i != 1
        if c["passed"] != should_pass:
            errors.append(f"case {c['name']}: passed={c['passed']}, expected {should_pass}")
        if not should_pass and not any(expect in f for f in c["failures"]):
            errors.append(f"case {c['name']}: no failure mentions {expect!r}: {c['failures']}")
    if errors:
        print("\n".join("FAILED: " + e for e in errors))
        return 1
    print(f"bad backend '{mode}': complete report, FAIL row names the cause, exit 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
