#!/usr/bin/env bash
# ci.budget must fail when a group's test count differs from its declaration
# and when the declared total exceeds the budget (ci/budget.py check).
#   budget_check_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1 build=$2 work=$3
mkdir -p "$work"
check() { # check FILE EXPECTED_TEXT: the check must exit 1 and print the text
  local out rc=0
  out=$(TOUCHSTONE_BUDGET_FILE=$1 python3 "$src/ci/budget.py" check "$build" 2>&1) || rc=$?
  echo "$out" | tail -3
  [ "$rc" = 1 ] || { echo "FAIL: exit $rc, expected 1"; exit 1; }
  grep -q "$2" <<<"$out" || { echo "FAIL: no '$2' in the output"; exit 1; }
}
python3 - "$src/ci/budget.json" "$work" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
g = sorted(b["groups"])[0]
miscount = json.loads(json.dumps(b)); miscount["groups"][g]["tests"] += 1000
json.dump(miscount, open(sys.argv[2] + "/miscount.json", "w"))
over = json.loads(json.dumps(b)); over["budget_seconds"] = 60
json.dump(over, open(sys.argv[2] + "/over.json", "w"))
PY
check "$work/miscount.json" "tests in CI, ci/budget.json declares"
check "$work/over.json" "exceeds the budget of 60 s"
echo "PASS: both bad declarations were refused"
