#!/usr/bin/env python3
"""ci/budget.py - CI's time budget: what each part of `ci/test` is declared to
cost, checked against the budget, and measured against the declaration.

The declarations live in ci/budget.json (one source of truth):
  budget_seconds   the whole of `ci/test` from a fresh clone with empty caches
                   on a 2-core machine (CI's hard limit is 90 min; ours is 45)
  phases           seconds of the phases outside the main ctest run
                   (bootstrap, build, asan), as measured on `host`; asan is what
                   the ASan job adds after the main ctest (the rest of its
                   build, which runs at nice 19 beside ctest, and its tests)
  ctest_jobs       the -j of the main ctest run (ci/test)
  ctest_packing    measured ctest wall / (summed test seconds / ctest_jobs):
                   the declared ctest phase is the groups' sum over -j times this
  groups           one entry per CTest group of the main run: the number of
                   tests and their summed seconds (each test's own wall time,
                   as `ctest -j` ran it on `host`)

A test's group is <kind>.<backend> from its CTest labels: kind is the first of
KINDS among its labels (else its first label), backend the first of BACKENDS
(none: the kind alone). So "parity;cpu_simd;quantized;..." is parity.cpu_simd.

  ci/budget.py check BUILD_DIR
      CTest ci.budget: every group of the main run (ctest -LE "slow|torch|gpu") is
      declared with its exact number of tests, and the declared total fits the
      budget. A new test therefore comes with its seconds (or a cut).
  ci/budget.py report BUILD_DIR JUNIT TIMES_JSON OUT_JSON
      ci/test's last step: the budget table (declared vs measured per phase and
      per group), printed and written as JSON.
  ci/budget.py declare BUILD_DIR JUNIT TIMES_JSON [--host TEXT]
      rewrites ci/budget.json's phases and groups from a measured run.
Exit status: 0 fine, 1 over budget or undeclared, 2 bad input (names the file).
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
# TOUCHSTONE_BUDGET_FILE: another declarations file (tests/budget: the check must fail)
BUDGET_FILE = os.environ.get("TOUCHSTONE_BUDGET_FILE") or os.path.join(HERE, "budget.json")
CI_EXCLUDE = "slow|torch|gpu"  # ci/test's ctest -LE on CI's machines (no GPU)
KINDS = ["unit", "isa_target", "fault", "serving", "structured", "contract", "testmodel", "consistency", "parity",
         "golden", "http", "python", "report", "sdk", "fuzz", "remote", "harness"]
BACKENDS = ["reference", "cpu_simd", "vulkan", "cuda", "static_graph", "llamacpp"]
PHASES = ["bootstrap", "build", "ctest", "asan"]


def fail_input(path, why):
    print(f"ci/budget.py: {path}: {why}", file=sys.stderr)
    sys.exit(2)


def load_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail_input(path, e)


def group_of(labels):
    kind = next((k for k in KINDS if k in labels), labels[0] if labels else "unlabelled")
    backend = next((b for b in BACKENDS if b in labels), None)
    return f"{kind}.{backend}" if backend else kind


def ci_tests(build_dir):
    """{test name: group} of the main ctest run (what ci/test runs)."""
    out = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1", "-LE", CI_EXCLUDE],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        fail_input(build_dir, f"ctest --show-only failed: {out.stderr.strip()}")
    tests = {}
    for t in json.loads(out.stdout)["tests"]:
        labels = next((p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"), [])
        if t["name"].endswith("_NOT_BUILT"):
            fail_input(build_dir, f"{t['name']}: build the tree first (gtest tests are listed after the build)")
        tests[t["name"]] = group_of(labels)
    return tests


def junit_times(path):
    """{test name: seconds} from ctest --output-junit."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        fail_input(path, e)
    return {c.get("name"): float(c.get("time", 0)) for c in root.iter("testcase")}


def by_group(tests, times=None):
    groups = {}
    for name, g in tests.items():
        e = groups.setdefault(g, {"tests": 0, "seconds": 0.0})
        e["tests"] += 1
        if times is not None:
            e["seconds"] += times.get(name, 0.0)
    return groups


def estimate(budget):
    """Declared wall seconds of ci/test: the phases plus the groups' seconds over ctest's -j."""
    ctest = (sum(g["seconds"] for g in budget["groups"].values()) / budget["ctest_jobs"] *
             budget.get("ctest_packing", 1.0))
    phases = {p: budget["phases"][p] for p in ("bootstrap", "build", "asan")}
    phases["ctest"] = ctest
    return phases, sum(phases.values())


def cmd_check(build_dir):
    budget = load_json(BUDGET_FILE)
    actual = by_group(ci_tests(build_dir))
    declared = budget["groups"]
    problems = []
    for g in sorted(set(actual) | set(declared)):
        n, d = actual.get(g, {"tests": 0})["tests"], declared.get(g, {"tests": 0})["tests"]
        if n != d:
            problems.append(f"group {g}: {n} tests in CI, ci/budget.json declares {d}: "
                            "declare its seconds (ci/budget.py declare after a measured run) "
                            "or label the new tests slow with a reason")
    phases, total = estimate(budget)
    for p in ("bootstrap", "build", "ctest", "asan"):
        print(f"{p:>10}  {phases[p]:8.0f} s")
    print(f"{'total':>10}  {total:8.0f} s declared, budget {budget['budget_seconds']} s "
          f"({len(actual)} groups, {sum(a['tests'] for a in actual.values())} tests; host: {budget['host']})")
    if total > budget["budget_seconds"]:
        problems.append(f"declared total {total:.0f} s exceeds the budget of {budget['budget_seconds']} s: "
                        "cut something (label it slow with its reason) or make it faster")
    for p in problems:
        print("ci.budget: " + p)
    return 1 if problems else 0


def measured(build_dir, junit, times_json):
    times = junit_times(junit)
    phases = load_json(times_json)
    groups = by_group(ci_tests(build_dir), times)
    return phases, groups


def cmd_report(build_dir, junit, times_json, out_json):
    budget = load_json(BUDGET_FILE)
    phases, groups = measured(build_dir, junit, times_json)
    declared_phases, declared_total = estimate(budget)
    rows = []
    print("\nci/test time budget (seconds; declared = ci/budget.json, measured here)")
    print(f"{'part':<28} {'declared':>9} {'measured':>9}")
    for p in PHASES:
        d, m = declared_phases.get(p), phases.get(p)
        rows.append({"part": p, "declared": d, "measured": m})
        print(f"{p:<28} {'-' if d is None else round(d):>9} {m if m is None else round(m):>9}")
    total = sum(v for v in phases.values() if v is not None)
    print(f"{'total (wall)':<28} {round(declared_total):>9} {round(total):>9}   budget {budget['budget_seconds']}")
    print(f"\nctest groups (summed test seconds at -j{budget['ctest_jobs']}), largest first")
    for g, e in sorted(groups.items(), key=lambda kv: -kv[1]["seconds"]):
        d = budget["groups"].get(g, {}).get("seconds")
        rows.append({"part": "ctest:" + g, "tests": e["tests"], "declared": d, "measured": e["seconds"]})
        flag = "  over" if d is not None and e["seconds"] > 1.25 * d + 10 else ""
        print(f"  {g:<26} {'-' if d is None else round(d):>9} {round(e['seconds']):>9}  ({e['tests']} tests){flag}")
    host = f"{cpu_model()}, {os.cpu_count()} cores"
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"host": host, "budget_seconds": budget["budget_seconds"], "total_measured": total,
                   "total_declared": declared_total, "rows": rows}, f, indent=1)
    print(f"\nci/test: {round(total)} s of a {budget['budget_seconds']} s budget on {host}; table: {out_json}")
    return 0


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def junit_seconds(junit):
    """The summed time of every test case of a JUnit file."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as e:
        fail_input(junit, e)
    return sum(float(tc.get("time", 0) or 0) for tc in root.iter("testcase"))


def cmd_declare(build_dir, junit, times_json, host):
    budget = load_json(BUDGET_FILE)
    phases, groups = measured(build_dir, junit, times_json)
    for p in ("bootstrap", "build", "asan"):
        if phases.get(p) is not None:
            budget["phases"][p] = round(phases[p])
    budget["groups"] = {g: {"tests": e["tests"], "seconds": round(e["seconds"])}
                        for g, e in sorted(groups.items())}
    # How far -j fell short of perfect packing: over every test the measured run
    # ran, also those labelled slow since (the wall time included them).
    total = junit_seconds(junit)
    if phases.get("ctest") and total > 0:
        budget["ctest_packing"] = round(phases["ctest"] / (total / budget["ctest_jobs"]), 3)
    budget["host"] = host or f"{cpu_model()}, {os.cpu_count()} cores"
    with open(BUDGET_FILE, "w", encoding="utf-8") as f:
        json.dump(budget, f, indent=1)
        f.write("\n")
    print(f"ci/budget.py: {BUDGET_FILE} rewritten from {junit} and {times_json}")
    return 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "check":
        return cmd_check(argv[1])
    if len(argv) == 5 and argv[0] == "report":
        return cmd_report(*argv[1:])
    if len(argv) in (4, 6) and argv[0] == "declare":
        host = argv[5] if len(argv) == 6 and argv[4] == "--host" else None
        return cmd_declare(argv[1], argv[2], argv[3], host)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
