#!/usr/bin/env bash
# golden.parts_merge: a model's goldens recorded in two parts (two processes, --only ...
# --part) and assembled with --merge are byte-identical to the whole recording of the
# same revision; a missing part, an item in two parts and a part of another model are
# refused (exit 2) naming the item or file.
#   golden_parts_test.sh TOUCHSTONE MANIFEST
set -euo pipefail
ts="$1" manifest="$2" model=llama-test-f32
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/full/goldens" "$work/merged/goldens"
rec() {  # rec MODEL args...
  local m=$1; shift
  "$ts" golden --manifest "$manifest" --model "$m" --allow-dirty -t 1 "$@" >/dev/null
}
rec "$model" --out "$work/full"
rec "$model" --only "$model.story" --part "$work/a.h5"
rec "$model" --only "$model.one_token" --only "$model.passage" --part "$work/b.h5"
"$ts" golden --manifest "$manifest" --merge "$work/a.h5" "$work/b.h5" --out "$work/merged" >/dev/null
cmp "$work/full/goldens/$model.h5" "$work/merged/goldens/$model.h5"
echo "merged golden == whole recording, byte for byte"
refused() {  # refused TEXT args...: exit 2 and TEXT in the message
  local text=$1; shift
  set +e
  out=$("$ts" golden --manifest "$manifest" "$@" --out "$work/merged" 2>&1)
  rc=$?
  set -e
  [[ $rc == 2 && $out == *"$text"* ]] || { echo "expected exit 2 with '$text', got $rc: $out"; exit 1; }
}
refused "is in none of the 1 parts" --merge "$work/a.h5"
refused "is in two parts" --merge "$work/a.h5" "$work/b.h5" "$work/a.h5"
rec llama-test-q8_0 --only llama-test-q8_0.story --part "$work/c.h5"
refused "not $work/a.h5's" --merge "$work/a.h5" "$work/b.h5" "$work/c.h5"
echo "missing, duplicate and foreign parts refused"
