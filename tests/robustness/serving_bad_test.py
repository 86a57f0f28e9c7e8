#!/usr/bin/env python3
"""The serving checks on the bad backend's serving faults (bad_backend.c): a
check that compared nothing, a noise allowance the backend inflates, a fork
that returns no session. Each must be judged, never a PASS by default.

usage: serving_bad_test.py TOUCHSTONE BAD_BACKEND_LIB MANIFEST OUT_DIR MODE
  max_batch1  max_batch below every batch size of the plan: batch_invariance
              and content_isolation are NOT SUPPORTED naming max_batch (exit 0:
              the case passes), never "PASS, 0/0 rows"
  noisy_leak  no bitwise claim, a cross-sequence leak hidden by repeats shifted
              by +0.5: content_isolation FAILs, naming the runs that set the
              noise allowance
  fork_null   --in-process, fork_session returns TS_OK and NULL: a FAIL row
              naming it (exit 1), not a crash
"""
import json
import os
import subprocess
import sys

CHECKS = {
    "max_batch1": ["serving.batch_invariance", "serving.content_isolation"],
    "noisy_leak": ["serving.content_isolation"],
    "fork_null": ["serving.prefix_fork"],
}


def main():
    touchstone, lib, manifest, out, mode = sys.argv[1:6]
    os.makedirs(out, exist_ok=True)
    rj = os.path.join(out, f"{mode}.json")
    if os.path.exists(rj):
        os.remove(rj)
    cmd = [touchstone, "parity", "--backend", lib, "--manifest", manifest, "--case", "one_token",
           "--max-steps", "2", "--serving", "--serving-plan", "smoke", "--json", rj]
    for c in CHECKS[mode]:
        cmd += ["--serving-check", c]
    if mode == "fork_null":
        cmd.append("--in-process")
    env = dict(os.environ, TOUCHSTONE_BAD_MODE=mode)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    print(p.stdout)
    print(p.stderr, file=sys.stderr)
    report = json.load(open(rj, encoding="utf-8"))
    rows = {c["name"]: c for c in report["cases"]}
    errors = []
    want_rc = 0 if mode == "max_batch1" else 1
    if p.returncode != want_rc:
        errors.append(f"exit status {p.returncode}, expected {want_rc}")
    if mode == "max_batch1":
        ns = {n["check"]: n["reason"] for n in report["not_supported"]}
        for c in CHECKS[mode]:
            if c in rows:
                errors.append(f"{c} has a result row: {rows[c]['verdict']}, "
                              f"{rows[c]['steps_compared']}/{rows[c]['steps_total']} rows")
            if "max_batch (1)" not in ns.get(c, ""):
                errors.append(f"{c} is not NOT SUPPORTED naming max_batch: {ns.get(c)!r}")
    else:
        name = "serving.content_isolation" if mode == "noisy_leak" else "serving"
        want = ("a run that sets the noise allowance" if mode == "noisy_leak"
                else "fork_session returned TS_OK with a NULL session")
        row = rows.get(name)
        if row is None or row["passed"]:
            errors.append(f"no failing {name} row: {row}")
        elif not any(want in f for f in row["failures"]):
            errors.append(f"{name}: no failure mentions {want!r}: {row['failures']}")
    if errors:
        print("\n".join("FAILED: " + e for e in errors))
        return 1
    print(f"serving fault '{mode}': judged as it must be")
    return 0


if __name__ == "__main__":
    sys.exit(main())
