#!/usr/bin/env python3
"""docs.facts: the facts several current documents repeat agree with their one
source of truth.

* Fault catalog size: "a catalog of N (deliberate) faults" anywhere equals the
  number of entries of kFaults in model/core/src/faults.cpp.
* Suite sizes: "the full suite has N cases ... M scoring passages" (and the
  same for the quick and smoke suites) equals goldens/manifest.json's suites.
* Backends: README's "## Backends" table names every in-tree backend
  (reference/backend and each backends/<name>/ with a CMakeLists.txt) and
  nothing else but remote channels (a name containing "://"); the per-backend
  table of docs/model-families.md names only in-tree backends, and a backend
  it gives "both" weight paths is one README gives full precision and
  quantized.

Documents: README.md and every *.md outside docs/history/ (superseded
material). Each disagreement is reported as file:line. Usage:
doc_facts_test.py REPO_ROOT
"""
import json
import os
import re
import sys

SKIP_DIRS = {".git", "build", "third_party", "node_modules", os.path.join("docs", "history")}
CATALOG = re.compile(r"catalog of (\d+) (?:deliberate )?faults", re.I)
SUITE = re.compile(r"(full|quick|smoke) suite has (\d+) cases\b(?:([^.]*?)(\d+) scoring passages)?",
                   re.I | re.S)


def documents(root):
    yield os.path.join(root, "README.md")
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = [x for x in dirs if os.path.normpath(os.path.join(rel, x)) not in SKIP_DIRS
                   and x not in SKIP_DIRS]
        for f in sorted(files):
            p = os.path.join(d, f)
            if f.endswith(".md") and os.path.relpath(p, root) != "README.md":
                yield p


def fault_count(root):
    text = open(os.path.join(root, "model", "core", "src", "faults.cpp"), encoding="utf-8").read()
    table = text[text.index("kFaults[]"):]
    table = table[:table.index("};")]
    return len(re.findall(r'^\s*\{"[^"]+",', table, re.M))


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def check_counts(root, errors):
    n_faults = fault_count(root)
    manifest = json.load(open(os.path.join(root, "goldens", "manifest.json"), encoding="utf-8"))
    suites = manifest["suites"]
    for path in documents(root):
        text = open(path, encoding="utf-8").read()
        rel = os.path.relpath(path, root)
        for m in CATALOG.finditer(text):
            if int(m.group(1)) != n_faults:
                errors.append(f"{rel}:{line_of(text, m.start())}: catalog of {m.group(1)} faults, "
                              f"model/core/src/faults.cpp has {n_faults}")
        for m in SUITE.finditer(text):
            s = suites.get(m.group(1).lower())
            if s is None:
                continue
            want_cases, want_scoring = len(s["cases"]), len(s["scoring"])
            where = f"{rel}:{line_of(text, m.start())}"
            if int(m.group(2)) != want_cases:
                errors.append(f"{where}: {m.group(1)} suite has {m.group(2)} cases, "
                              f"goldens/manifest.json has {want_cases}")
            if m.group(4) and int(m.group(4)) != want_scoring:
                errors.append(f"{where}: {m.group(1)} suite has {m.group(4)} scoring passages, "
                              f"goldens/manifest.json has {want_scoring}")


def table_after(text, heading):
    """Rows (cells, line) of the first table after `heading`; the first cell
    without backticks, header and separator rows left out."""
    start = text.find(heading)
    if start < 0:
        return None
    rows, seen = [], False
    for n, line in enumerate(text[start:].splitlines(), line_of(text, start)):
        if line.startswith("|"):
            seen = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] in ("backend",) or set(cells[0]) <= set("-: "):
                continue
            rows.append(([cells[0].strip("`")] + cells[1:], n))
        elif seen:
            break
    return rows


def in_tree_backends(root):
    names = {"reference"}
    for d in sorted(os.listdir(os.path.join(root, "backends"))):
        if os.path.isfile(os.path.join(root, "backends", d, "CMakeLists.txt")):
            names.add(d)
    return names


def check_backends(root, errors):
    backends = in_tree_backends(root)
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    rows = table_after(readme, "\n## Backends\n")
    if not rows:
        errors.append("README.md: no table after '## Backends'")
        return
    # README's columns: backend | what | weight paths | CI here
    weight_col = {}
    for cells, n in rows:
        name = cells[0]
        if "://" in name:
            continue
        if name not in backends:
            errors.append(f"README.md:{n}: backends table names '{name}', not an in-tree backend")
        weight_col[name] = cells[2].lower() if len(cells) > 2 else ""
    for name in sorted(backends - set(weight_col)):
        errors.append(f"README.md: backends table lacks in-tree backend '{name}'")
    fam_path = os.path.join(root, "docs", "model-families.md")
    fam = open(fam_path, encoding="utf-8").read()
    rows = table_after(fam, "Every in-tree backend computes every family")
    # docs/model-families.md's columns: backend | weight paths | checked on
    for cells, n in rows or []:
        name, wpaths = cells[0], cells[1] if len(cells) > 1 else ""
        if name not in backends:
            errors.append(f"docs/model-families.md:{n}: '{name}' is not an in-tree backend")
        elif wpaths.startswith("both"):
            w = weight_col.get(name, "")
            if "full precision" not in w or "quantized" not in w:
                errors.append(f"docs/model-families.md:{n}: '{name}' has both weight paths, "
                              f"README.md's backends table says '{w}'")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    errors = []
    check_counts(root, errors)
    check_backends(root, errors)
    for e in errors:
        print(e)
    if errors:
        return 1
    print("docs.facts: fault catalog, suite sizes and backend tables agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
