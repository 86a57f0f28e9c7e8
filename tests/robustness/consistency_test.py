#!/usr/bin/env python3
"""Each golden-free consistency check catches the fault built to break it.

Runs `touchstone parity --consistency-only` on the bad backend (the reference
with one consistency fault, tests/robustness/bad_backend.c) and requires: exit
status 1, the named check FAIL in the JSON report with a failure naming what
broke, and every check PASS for the fault-free mode "none".
    consistency_test.py TOUCHSTONE BAD_LIB MANIFEST OUT_DIR MODE EXPECTED_CHECK WORDS
"""
import json, os, subprocess, sys


def main():
    touchstone, lib, manifest, out, mode, check, words = sys.argv[1:8]
    os.makedirs(out, exist_ok=True)
    rj = os.path.join(out, f"consistency-{mode}.json")
    if os.path.exists(rj):
        os.remove(rj)
    env = dict(os.environ, TOUCHSTONE_BAD_MODE=mode,
               TOUCHSTONE_BAD_STATE=os.path.join(out, f"consistency-{mode}.state"),
               TOUCHSTONE_BAD_AT="-1")
    cmd = [touchstone, "parity", "--backend", lib, "--manifest", manifest, "--consistency-only",
           "--json", rj, "--timeout", "120", "--case", "narrative", "--consistency-tokens", "10"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    print(p.stdout[-3000:])
    with open(rj, encoding="utf-8") as f:
        report = json.load(f)
    rows = {c["name"]: c for c in report["cases"]}
    errors = []
    if mode == "none":
        if p.returncode != 0 or not all(c["passed"] for c in rows.values()) or len(rows) != 5:
            errors.append(f"fault-free run: exit {p.returncode}, rows {list(rows)}")
    else:
        row = rows.get(check)
        if p.returncode != 1:
            errors.append(f"exit status {p.returncode}, expected 1")
        if row is None or row["passed"]:
            errors.append(f"{check} did not fail: {row}")
        elif not any(w in " ".join(row["failures"]) for w in words.split("|")):
            errors.append(f"{check} failure does not say {words!r}: {row['failures']}")
    for e in errors:
        print("FAIL:", e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
