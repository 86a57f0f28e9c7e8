#!/usr/bin/env python3
"""docs.schema_version: every current document that states the JSON report's
schema_version states the one of docs/report.schema.json, and report.h's
kReportSchemaVersion is that number too.

The schema's "schema_version": {"const": N} is the one source of truth. A
document (README.md and every *.md of the tree outside docs/history/, which
keeps superseded material) that writes "schema_version" (or "schema version")
followed by a number, e.g. "`schema_version` 1", "| `schema_version` | `1` |",
"\"schema_version\": 2", "schema_version 1-2", must name N (a range must end at
N). Each disagreement is reported as file:line. Usage: schema_version_test.py REPO_ROOT
"""
import json
import os
import re
import sys

SCHEMA = os.path.join("docs", "report.schema.json")
HEADER = os.path.join("parity", "report", "include", "touchstone", "report", "report.h")
SKIP_DIRS = {".git", "build", "third_party", "node_modules", os.path.join("docs", "history")}
# "schema_version" / "schema version", then up to a few separators (backticks,
# quotes, table bars, ':' '=' "is"), then a number or a range of numbers.
MENTION = re.compile(r"schema[_ ]version[`\"']?\s*(?:\|\s*)?(?:[:=]\s*|is\s+|of\s+)?[`\"']?"
                     r"(\d+)(?:\s*(?:-|–|to)\s*(\d+))?", re.I)


def schema_version(root):
    path = os.path.join(root, SCHEMA)
    try:
        schema = json.load(open(path, encoding="utf-8"))
        return int(schema["properties"]["schema_version"]["const"]), None
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"{path}: cannot read properties.schema_version.const ({e})"


def header_version(root):
    path = os.path.join(root, HEADER)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        return None, None, f"{path}: {e}"
    for n, line in enumerate(text.splitlines(), 1):
        m = re.search(r"kReportSchemaVersion\s*=\s*(\d+)", line)
        if m:
            return int(m.group(1)), n, None
    return None, None, f"{path}: no 'kReportSchemaVersion = N'"


def documents(root):
    yield os.path.join(root, "README.md")
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs if os.path.normpath(os.path.join(rel, x)) not in SKIP_DIRS
                         and not x.startswith("build"))
        for f in sorted(files):
            if f.endswith(".md") and not (rel == "." and f == "README.md"):
                yield os.path.join(d, f)


def main(root):
    version, err = schema_version(root)
    if err:
        return [err]
    problems = []
    hv, hline, err = header_version(root)
    if err:
        problems.append(err)
    elif hv != version:
        problems.append(f"{os.path.join(root, HEADER)}:{hline}: kReportSchemaVersion = {hv}, "
                        f"{SCHEMA} says schema_version {version}")
    mentions = 0
    for path in documents(root):
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except OSError as e:
            problems.append(f"{path}: {e}")
            continue
        for n, line in enumerate(lines, 1):
            for m in MENTION.finditer(line):
                mentions += 1
                stated = int(m.group(2) or m.group(1))
                if stated != version:
                    problems.append(f"{path}:{n}: states schema_version {m.group(0)!r}, "
                                    f"{SCHEMA} says {version}: {line.strip()}")
    if not problems:
        print(f"schema_version {version}: {SCHEMA}, {HEADER} and {mentions} mentions in the docs agree")
    return problems


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: schema_version_test.py REPO_ROOT")
    found = main(sys.argv[1])
    for p in found:
        print("docs.schema_version: " + p)
    sys.exit(1 if found else 0)
