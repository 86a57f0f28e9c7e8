#!/usr/bin/env python3
"""known_divergence_test.py MODE TOUCHSTONE MANIFEST SCHEMA WORKDIR

Drives `touchstone parity --known-divergences` on the reference with an
injected fault (logits_perturb_1e-3, caught at step 0 of `narrative`), so the
failing numbers come from a real run, never from this file. Each MODE writes an
entries file derived from that run and checks the verdict and exit code:

  covered        every violation listed, accepted above its value -> exit 0,
                 report verdict KNOWN_DIVERGENCE, case verdict KNOWN_DIVERGENCE,
                 the JSON validates against docs/report.schema.json
  beyond         accept below this run's value (measured lower still) -> exit 1, FAIL
                 naming "beyond the accepted"
  missing-check  one violated check left out of the entry -> exit 1, "is not in the entry"
  stale          the same entry, run without the fault (the item passes) -> exit 1,
                 "no longer reproduces"
  other-model    the entry names another model -> ignored: exit 1, plain FAIL
  malformed      broken entry files -> exit 2, the error names the file, entry and field
  structured-case  a structured check's row (fault grammar_mask_one_step_late on
                 structured_answer, structured.mask_parity): an entry for
                 "structured.mask_parity@structured_answer" covers it (exit 0), one
                 for another case does not (exit 1), and the case's entry wins over
                 the plain item's (a stricter @case entry: exit 1, "beyond the accepted")
"""
import json
import os
import subprocess
import sys

MODE, CLI, MANIFEST, SCHEMA, WORK = sys.argv[1:6]
CASE = "narrative"
BASE = [CLI, "parity", "--backend", "reference", "--case", CASE, "--max-steps", "8",
        "--no-consistency", "--threads", "1", "--manifest", MANIFEST]
os.makedirs(WORK, exist_ok=True)


def run(extra, name):
    report = os.path.join(WORK, f"{MODE}-{name}.json")
    p = subprocess.run(BASE + extra + ["--json", report], capture_output=True, text=True,
                       timeout=600)
    j = json.load(open(report)) if os.path.exists(report) and p.returncode != 2 else None
    return p, j


def fail(msg, p=None):
    print(f"FAIL ({MODE}): {msg}")
    if p is not None:
        print(p.stdout[-3000:], p.stderr[-3000:])
    sys.exit(1)


def entry(violations, model, scale_accept, scale_measured=1.0, drop=None):
    checks = {}
    for v in violations:
        if v["check"] == drop:
            continue
        lower = v["check"] in ("top1_agreement", "greedy")
        measured = v["value"] * scale_measured
        accept = v["value"] * (1 / scale_accept if lower else scale_accept)
        if lower:
            measured = max(measured, accept)
        else:
            measured = min(measured, accept)
        checks[v["check"]] = {"measured": measured, "accept": accept}
    return {"id": f"test-{MODE}", "backend": "reference", "model": model,
            "weights": "full_precision", "profile": "exact", "item": CASE, "checks": checks,
            "why": "test: injected fault logits_perturb_1e-3", "measured_on": "this run",
            "reviewed_by": "known_divergence_test.py"}


def write(entries, name="entries"):
    path = os.path.join(WORK, f"{MODE}-{name}.json")
    with open(path, "w") as f:
        json.dump({"format": "touchstone-known-divergences", "version": 1, "entries": entries}, f)
    return path


def structured_case():
    """MODE structured-case: entries narrowed to one grammar case."""
    check = "structured.mask_parity"
    args = [CLI, "parity", "--backend", "reference", "--case", "structured_answer",
            "--structured-only", "--structured-check", check, "--fault", "grammar_mask_one_step_late",
            "--threads", "1", "--manifest", MANIFEST]

    def go(entries, name):
        report = os.path.join(WORK, f"{MODE}-{name}.json")
        p = subprocess.run(args + ["--known-divergences", write(entries, name), "--json", report]
                           if entries else args + ["--json", report],
                           capture_output=True, text=True, timeout=600)
        return p, json.load(open(report))
    p, j = go(None, "measure")
    rows = [c for c in j["cases"] if c["name"] == check]
    if p.returncode != 1 or not rows or rows[0]["passed"]:
        fail(f"the faulted run must FAIL {check}", p)
    viol = rows[0]["violations"]
    worst = max(v["value"] for v in viol)

    def e(item, accept):
        return {"id": f"test-{item}", "backend": "reference", "model": j["model"]["name"],
                "weights": "full_precision", "profile": "exact", "item": item,
                "checks": {"mask_difference": {"measured": accept, "accept": accept}},
                "why": "test: grammar_mask_one_step_late", "measured_on": "this run",
                "reviewed_by": "known_divergence_test.py"}
    p, j = go([e(check + "@structured_answer", worst)], "covered")
    if p.returncode != 0 or j["verdict"] != "KNOWN_DIVERGENCE":
        fail("an entry for the case must cover its row", p)
    p, j = go([e(check + "@structured_date", worst)], "other-case")
    if p.returncode != 1 or j["verdict"] != "FAIL":
        fail("an entry for another case must not apply", p)
    p, j = go([e(check, worst), e(check + "@structured_answer", worst / 2)], "precedence")
    if p.returncode != 1 or "beyond the accepted" not in p.stdout:
        fail("the case's entry (stricter) must win over the plain item's", p)
    print(f"PASS ({MODE}): {len(viol)} violations, worst {worst}")
    sys.exit(0)


if MODE == "structured-case":
    structured_case()

# The measurement: the fault's violations on this build.
p, base = run(["--fault", "logits_perturb_1e-3"], "measure")
if p.returncode != 1 or base is None or base["verdict"] != "FAIL":
    fail("the faulted run must FAIL (exit 1)", p)
viol = base["cases"][0]["violations"]
if not viol or any(v["check"] in ("backend_error", "non_finite") for v in viol):
    fail(f"unexpected violations of the faulted run: {viol}", p)
model = base["model"]["name"]
print(f"faulted run violates: {viol}")

if MODE == "covered":
    p, j = run(["--fault", "logits_perturb_1e-3", "--known-divergences",
                write([entry(viol, model, 1.5)])], "run")
    if p.returncode != 0 or j["verdict"] != "KNOWN_DIVERGENCE":
        fail(f"expected exit 0 and KNOWN_DIVERGENCE, got {p.returncode}", p)
    c = j["cases"][0]
    if c["verdict"] != "KNOWN_DIVERGENCE" or not c["known_divergence"] or c["passed"]:
        fail(f"case: {c['verdict']} {c['known_divergence']}", p)
    if "known divergences (reviewed" not in p.stdout:
        fail("the table must list the known divergence", p)
    import jsonschema
    jsonschema.validate(j, json.load(open(SCHEMA)))
elif MODE == "beyond":
    p, j = run(["--fault", "logits_perturb_1e-3", "--known-divergences",
                write([entry(viol, model, 0.8, 0.5)])], "run")
    if p.returncode != 1 or j["verdict"] != "FAIL" or "beyond the accepted" not in p.stdout:
        fail("expected FAIL naming 'beyond the accepted'", p)
elif MODE == "missing-check":
    if len(viol) < 2:
        # One violation only: an entry listing another check stands in.
        e = entry(viol, model, 1.5)
        e["checks"] = {"kld_mean": {"measured": 1.0, "accept": 2.0}}
    else:
        e = entry(viol, model, 1.5, drop=viol[0]["check"])
    p, j = run(["--fault", "logits_perturb_1e-3", "--known-divergences", write([e])], "run")
    if p.returncode != 1 or "is not in the entry" not in p.stdout:
        fail("expected FAIL naming the check that is not in the entry", p)
elif MODE == "stale":
    p, j = run(["--known-divergences", write([entry(viol, model, 1.5)])], "run")
    if p.returncode != 1 or "no longer reproduces" not in p.stdout:
        fail("expected FAIL: the entry's item passes", p)
elif MODE == "other-model":
    p, j = run(["--fault", "logits_perturb_1e-3", "--known-divergences",
                write([entry(viol, "another-model", 1.5)])], "run")
    if p.returncode != 1 or j["verdict"] != "FAIL" or j["cases"][0]["known_divergence"]:
        fail("an entry for another model must not apply", p)
elif MODE == "malformed":
    good = entry(viol, model, 1.5)
    bad = []
    for field, value in [("reviewed_by", ""), ("weights", "int4"), ("checks", {}),
                         ("checks", {"backend_error": {"measured": 0, "accept": 1}}),
                         # a failed bitwise claim is withdrawn, never waived (issue 37)
                         ("checks", {"bitwise": {"measured": 0.5, "accept": 0.6}}),
                         ("checks", {"kld_mean": {"measured": 2.0, "accept": 1.0}}),
                         ("surprise", 1)]:
        e = dict(good)
        e[field] = value
        bad.append((field, [e]))
    bad.append(("id", [good, dict(good)]))
    for i, (field, entries) in enumerate(bad):
        path = write(entries, f"bad{i}")
        p = subprocess.run(BASE + ["--known-divergences", path], capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 2 or path not in p.stderr or field not in p.stderr:
            fail(f"malformed entry ({field}) must be exit 2 naming {path} and '{field}'", p)
        print(f"refused as expected: {p.stderr.strip().splitlines()[-1]}")
    garbage = os.path.join(WORK, "garbage.json")
    open(garbage, "w").write("{\"format\": ")
    p = subprocess.run(BASE + ["--known-divergences", garbage], capture_output=True, text=True)
    if p.returncode != 2 or "not valid JSON" not in p.stderr:
        fail("truncated JSON must be exit 2 'not valid JSON'", p)
else:
    fail(f"unknown mode {MODE}")
print(f"PASS ({MODE})")
