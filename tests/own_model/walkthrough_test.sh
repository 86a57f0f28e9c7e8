#!/usr/bin/env bash
# Runs the walkthrough of docs/own-model.md (the ```sh block between the
# walkthrough markers) exactly as written, with touchstone on PATH, $MODEL set
# and the doc's example cases.json, in a scratch directory. Fails when any
# command fails or the doc no longer has the block.
#   walkthrough_test.sh DOC TOUCHSTONE_BIN_DIR MODEL
set -euo pipefail
doc=$1 bindir=$2 model=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
script=$(awk '/<!-- walkthrough:begin -->/{on=1; next} /<!-- walkthrough:end -->/{on=0} on' "$doc" |
  sed -n '/^```sh$/,/^```$/p' | sed '1d;$d')
[ -n "$script" ] || { echo "no walkthrough block in $doc" >&2; exit 1; }
# The cases file: the first ```json block of the doc.
awk '/^```json$/{on=1; next} /^```$/{if(on) exit} on' "$doc" > "$work/cases.json"
cd "$work"
export PATH="$bindir:$PATH" MODEL="$model"
echo "$script"
bash -euo pipefail -c "$script"
grep -q '"verdict": "PASS"' report.json || { echo "report.json does not say PASS" >&2; exit 1; }
echo "walkthrough passed"
