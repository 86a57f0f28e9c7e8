#!/usr/bin/env python3
"""The reports people read (docs/report-format.md), one CTest per mode:

  schema-pass         a PASS run (a greedy case + a scoring passage) validates against
                      docs/report.schema.json, with per-step / per-position series
  schema-fail         a FAIL run (--fault) validates; first failing step 0 in the JSON
  schema-unsupported  an UNSUPPORTED run (reference --weights quantized) validates
  schema-consistency  a consistency-only run validates
  schema-serving      a serving-checks run (prefix_fork only) validates; drift per fork point,
                      batching / fork modes named
  schema-shards       two shards' reports (--shard I/2) and their merge validate
  schema-negative     a valid report with any required field removed (top level, a
                      case, a passage) or a wrong type fails validation
  markdown            --summary of a FAIL run: verdict line, matrix, first failing step + why
  progress-tty        stderr a terminal: a status line rewritten with \\r (tok/s, ETA)
  progress-not-tty    stderr a pipe: no \\r, no escape codes, the usual per-check lines
  cli-version         touchstone --version: version + compiled-in revision, exit 0
  cli-list            touchstone list: models (sha256 prefix, file), cases, passages
  cli-help            --help of touchstone and of parity state the exit codes

usage: report_test.py MODE TOUCHSTONE MANIFEST SCHEMA WORKDIR BACKEND WEIGHTS
Exit 0 = pass, 1 = fail, 77 = skip (jsonschema missing outside CI; in CI that fails).
"""
import json
import os
import pty
import re
import select
import subprocess
import sys

SKIP = 77


def in_ci():
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def load_validator(schema_path):
    try:
        import jsonschema  # Debian: python3-jsonschema (ci/packages/core.txt)
    except ImportError:
        msg = "python3 module jsonschema missing (apt-get install python3-jsonschema)"
        if in_ci():
            fail(msg + "; CI=true: a missing validator fails, never skips")
        print(f"SKIP: {msg}")
        sys.exit(SKIP)
    with open(schema_path) as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def errors_of(validator, report):
    return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in validator.iter_errors(report)]


class Ctx:
    def __init__(self, argv):
        (self.mode, self.touchstone, self.manifest, self.schema, self.work, self.backend,
         self.weights) = argv
        os.makedirs(self.work, exist_ok=True)

    def path(self, name):
        return os.path.join(self.work, f"{self.mode}.{name}")

    def parity(self, *args, expect_rc, stderr=subprocess.PIPE):
        cmd = [self.touchstone, "parity", "--manifest", self.manifest, "--threads", "1", *args]
        print("$", " ".join(cmd))
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=120)
        print(p.stdout[-3000:])
        if p.stderr:
            print(p.stderr[-3000:])
        if p.returncode != expect_rc:
            fail(f"exit status {p.returncode}, expected {expect_rc}")
        return p

    def quick_run(self, *extra, expect_rc=0):
        """A greedy case (8 steps) and a scoring passage (32 positions)."""
        out = self.path("json")
        self.parity("--backend", self.backend, "--weights", self.weights, "--case", "narrative",
                    "--scoring", "alice_ch1", "--max-steps", "8", "--max-positions", "32",
                    "--json", out, *extra, expect_rc=expect_rc)
        with open(out) as f:
            return json.load(f)


def validate(ctx, report):
    errs = errors_of(load_validator(ctx.schema), report)
    if errs:
        fail("report does not match docs/report.schema.json:\n  " + "\n  ".join(errs[:20]))
    print("schema: valid")


def manifest_sha256(ctx, model):
    with open(ctx.manifest) as f:
        return next(m["sha256"] for m in json.load(f)["models"] if m["name"] == model)


def check_common(ctx, r, verdict):
    if r["verdict"] != verdict:
        fail(f"verdict {r['verdict']}, expected {verdict}")
    if r["schema_version"] != 2:
        fail(f"schema_version {r['schema_version']}")
    if not r["touchstone"]["revision"] or not r["touchstone"]["version"]:
        fail("touchstone version / revision empty")
    if r["model"]["sha256"] != manifest_sha256(ctx, r["model"]["name"]):
        fail("model sha256 is not the manifest's")
    if r["complete"] and r["finished_at"] is None:
        fail("a complete report has no finished_at")
    if r["finished_at"] is not None and r["finished_at"] < r["started_at"]:
        fail("finished_at before started_at")


def check_series(r):
    for c in r["cases"]:
        s = c["series"]
        n = c["steps_compared"] if c["kind"] == "greedy" else 0
        for k in ("top1_match", "ref_top2_margin", "kl", "nmse", "max_abs"):
            if len(s[k]) != n:
                fail(f"case {c['name']}: series.{k} has {len(s[k])} entries, expected {n}")
        if c["kind"] == "greedy" and sum(s["top1_match"]) != c["tokens_matched"]:
            fail(f"case {c['name']}: series.top1_match disagrees with tokens_matched")
    for p in r["scoring"]:
        for k in ("top1_match", "kl", "nmse", "max_abs"):
            if len(p["series"][k]) != p["positions"]:
                fail(f"passage {p['name']}: series.{k} has {len(p['series'][k])} entries, "
                     f"expected {p['positions']}")


def mode_schema_pass(ctx):
    r = ctx.quick_run(expect_rc=0)
    validate(ctx, r)
    check_common(ctx, r, "PASS")
    check_series(r)
    if [c["name"] for c in r["cases"]] != ["narrative"] or len(r["scoring"]) != 1:
        fail("expected the case narrative and one scoring passage")
    if r["cases"][0]["steps_compared"] != 8 or r["scoring"][0]["positions"] != 32:
        fail("--max-steps 8 / --max-positions 32 not honoured")
    caps = r["backend"]["capabilities"]
    if caps is None or not caps["weight_types"] or r["backend"]["api_version"] < 1:
        fail("backend capabilities / api_version missing")


def mode_schema_fail(ctx):
    r = ctx.quick_run("--fault", "logits_perturb_1e-3", expect_rc=1)
    validate(ctx, r)
    check_common(ctx, r, "FAIL")
    check_series(r)
    if r["cases"][0]["first_failing_step"] != 0 or r["scoring"][0]["first_failing_position"] != 0:
        fail("logits_perturb_1e-3 must fail at step 0 and position 0")


def mode_schema_unsupported(ctx):
    out = ctx.path("json")
    ctx.parity("--backend", "reference", "--weights", "quantized", "--case", "narrative",
               "--json", out, expect_rc=3)
    with open(out) as f:
        r = json.load(f)
    validate(ctx, r)
    check_common(ctx, r, "UNSUPPORTED")
    if not r["reason"]:
        fail("UNSUPPORTED without a reason")


def mode_schema_consistency(ctx):
    out = ctx.path("json")
    ctx.parity("--backend", ctx.backend, "--weights", ctx.weights, "--case", "narrative",
               "--consistency-only", "--consistency-tokens", "8", "--json", out, expect_rc=0)
    with open(out) as f:
        r = json.load(f)
    validate(ctx, r)
    check_common(ctx, r, "PASS")
    check_series(r)
    if not r["cases"] or any(c["kind"] != "consistency" for c in r["cases"]):
        fail("a consistency-only run must list only consistency checks")


def mode_schema_serving(ctx):
    out = ctx.path("json")
    ctx.parity("--backend", ctx.backend, "--weights", ctx.weights, "--case", "narrative",
               "--serving-only", "--serving-plan", "quick", "--serving-check",
               "serving.prefix_fork", "--json", out, expect_rc=0)
    with open(out) as f:
        r = json.load(f)
    validate(ctx, r)
    check_common(ctx, r, "PASS")
    if [c["name"] for c in r["cases"]] != ["serving.prefix_fork"]:
        fail(f"expected only serving.prefix_fork, got {[c['name'] for c in r['cases']]}")
    c = r["cases"][0]
    if c["kind"] != "serving" or len(c["drift"]) < 2 or any(d["rows"] < 1 for d in c["drift"]):
        fail(f"serving row without drift per fork point: {c['drift']}")
    if r["backend"]["batching"] is None or r["backend"]["fork"] is None:
        fail("a serving run must name how batches and forks ran")


def mode_schema_shards(ctx):
    """Two shards of a case + a passage, each report and their merge valid."""
    shards = []
    for i in range(2):
        out = ctx.path(f"shard{i}.json")
        ctx.parity("--backend", ctx.backend, "--weights", ctx.weights, "--case", "narrative",
                   "--scoring", "alice_ch1", "--max-steps", "8", "--max-positions", "32",
                   "--shard", f"{i}/2", "--json", out, expect_rc=0)
        with open(out) as f:
            r = json.load(f)
        validate(ctx, r)
        check_common(ctx, r, "PASS")
        if r["shard"]["index"] != i or len(r["shard"]["items"]) != 1:
            fail(f"shard {i}: {r['shard']}")
        shards.append(out)
    merged = ctx.path("merged.json")
    p = subprocess.run([ctx.touchstone, "merge", *shards, "--json", merged],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    print(p.stdout[-3000:])
    if p.returncode != 0:
        fail(f"merge: exit status {p.returncode}")
    with open(merged) as f:
        r = json.load(f)
    validate(ctx, r)
    check_common(ctx, r, "PASS")
    check_series(r)
    if "shard" in r or len(r["shards"]) != 2:
        fail("a merged report has shards[], not shard")


def mode_schema_negative(ctx):
    r = ctx.quick_run(expect_rc=0)
    v = load_validator(ctx.schema)
    if errors_of(v, r):
        fail("the unmodified report must validate")
    with open(ctx.schema) as f:
        schema = json.load(f)
    targets = [((), schema["required"]),
               (("cases", 0), schema["$defs"]["case"]["required"]),
               (("scoring", 0), schema["$defs"]["scoring"]["required"]),
               (("cases", 0, "series"), schema["$defs"]["case_series"]["required"]),
               (("backend",), schema["properties"]["backend"]["required"])]
    tried = 0
    for where, fields in targets:
        for field in fields:
            doc = json.loads(json.dumps(r))
            obj = doc
            for k in where:
                obj = obj[k]
            del obj[field]
            tried += 1
            if not errors_of(v, doc):
                fail(f"removing required field {'/'.join(map(str, where + (field,)))} "
                     "still validates")
    for mutate, what in ((lambda d: d.update(schema_version="1"), "schema_version as a string"),
                         (lambda d: d.update(verdict="MAYBE"), "an unknown verdict"),
                         (lambda d: d.update(extra_field=1), "an undeclared field"),
                         (lambda d: d["cases"][0]["series"]["kl"].append("x"), "a string in a series")):
        doc = json.loads(json.dumps(r))
        mutate(doc)
        if not errors_of(v, doc):
            fail(f"a report with {what} still validates")
    print(f"{tried} removed required fields and 4 wrong values all fail validation")


def mode_markdown(ctx):
    md = ctx.path("md")
    r = ctx.quick_run("--fault", "logits_perturb_1e-3", "--summary", md, expect_rc=1)
    with open(md, encoding="utf-8") as f:
        text = f.read()
    print(text)
    want = [r"^### Touchstone parity: .*FAIL", r"\*\*verdict: FAIL\*\*",
            r"^\| backend \| model \| weights \|", r"^\| case / passage \|",
            r"^\| narrative \| .*FAIL @0", r"^\| alice\\_ch1 \| .*FAIL @0",
            r"narrative\*\*: first failing step 0", r"alice\\_ch1\*\*: first failing position 0",
            r"^  - why: .*logits diverge at step 0"]
    for w in want:
        if not re.search(w, text, re.M):
            fail(f"the Markdown summary lacks /{w}/")
    if r["verdict"] != "FAIL":
        fail("expected a FAIL report")


def run_on_pty(cmd):
    """Runs cmd with stderr on a pseudo-terminal; returns (rc, stderr bytes)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            p.kill()
            fail("no output for 120 s")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.wait(), out


def parity_args(ctx):
    return [ctx.touchstone, "parity", "--manifest", ctx.manifest, "--threads", "1", "--backend",
            ctx.backend, "--weights", ctx.weights, "--case", "narrative", "--scoring",
            "alice_ch1", "--max-steps", "8", "--max-positions", "32", "--no-consistency"]


def mode_progress_tty(ctx):
    rc, err = run_on_pty(parity_args(ctx))
    text = err.decode("utf-8", "replace")
    print(repr(text[-2000:]))
    if rc != 0:
        fail(f"exit status {rc}")
    for w in ("\r", "tok/s", "ETA", "[1/2] narrative", "[2/2] alice_ch1", "PASS ("):
        if w not in text:
            fail(f"the terminal progress lacks {w!r}")


def mode_progress_not_tty(ctx):
    p = ctx.parity("--backend", ctx.backend, "--weights", ctx.weights, "--case", "narrative",
                   "--scoring", "alice_ch1", "--max-steps", "8", "--max-positions", "32",
                   expect_rc=0)
    if "\r" in p.stderr or "\x1b" in p.stderr:
        fail("stderr is not a terminal, yet the progress has \\r or escape codes")
    if not re.search(r"^  \[1/2\] narrative +PASS \(\d", p.stderr, re.M):
        fail("the per-check progress line is missing")


def mode_cli_version(ctx):
    p = subprocess.run([ctx.touchstone, "--version"], capture_output=True, text=True, timeout=30)
    print(p.stdout, p.stderr)
    if p.returncode != 0 or not re.match(r"touchstone \d+\.\d+\.\d+ \(revision \S+\)", p.stdout):
        fail("expected 'touchstone X.Y.Z (revision R)' and exit 0")


def mode_cli_list(ctx):
    p = subprocess.run([ctx.touchstone, "list", "--manifest", ctx.manifest], capture_output=True,
                       text=True, timeout=60)
    print(p.stdout, p.stderr)
    if p.returncode != 0:
        fail(f"exit status {p.returncode}")
    with open(ctx.manifest) as f:
        m = json.load(f)
    for model in m["models"]:
        if not re.search(rf"^  {re.escape(model['name'])} +sha256 {model['sha256'][:12]}.*"
                         rf"{re.escape(model['filename'])}", p.stdout, re.M):
            fail(f"model {model['name']} not listed with its sha256 prefix and file")
    for c in m["cases"]:
        if not re.search(rf"^  {re.escape(c['name'])} +{re.escape(c['model'])} +{c['n_predict']} ",
                         p.stdout, re.M):
            fail(f"case {c['name']} not listed with its model and steps")
    for s in m.get("scoring", []):
        if not re.search(rf"^  {re.escape(s['name'])} +{re.escape(s['model'])} +\d+ ", p.stdout,
                         re.M):
            fail(f"scoring passage {s['name']} not listed with its model and tokens")
    bad = subprocess.run([ctx.touchstone, "list", "--manifest", ctx.path("nonexistent.json")],
                         capture_output=True, text=True, timeout=30)
    if bad.returncode != 2 or "nonexistent.json" not in bad.stderr:
        fail("a missing manifest must exit 2 naming the file")


def mode_cli_help(ctx):
    for args in ([], ["parity"]):
        p = subprocess.run([ctx.touchstone, *args, "--help"], capture_output=True, text=True,
                           timeout=30)
        text = " ".join(p.stdout.split())
        for w in ("0 PASS", "1 FAIL", "2 error", "3 UNSUPPORTED", "77 SKIP"):
            if p.returncode != 0 or w not in text:
                fail(f"`touchstone {' '.join(args)} --help` does not state '{w}' (exit "
                     f"{p.returncode})")


def main():
    if len(sys.argv) != 8:
        print(__doc__)
        return 2
    ctx = Ctx(sys.argv[1:])
    fn = globals().get("mode_" + ctx.mode.replace("-", "_"))
    if fn is None:
        print(f"unknown mode {ctx.mode}")
        return 2
    fn(ctx)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
