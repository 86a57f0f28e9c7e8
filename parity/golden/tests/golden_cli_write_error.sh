#!/usr/bin/env bash
# `touchstone golden` when the golden cannot be written: exit 2 with the errno
# text, the previous golden byte-identical, no temp file left, no crash at exit
# (exit 139 from libhdf5's exit-time cleanup was the old failure).
#
# usage: golden_cli_write_error.sh <touchstone> <goldens/manifest.json> <work dir>
# Records a tiny golden (one 1-token case, 2 steps) with the real model, then
#   - --out to a missing directory: refused before recording;
#   - as root, on a full 1 MiB tmpfs: "No space left on device" (ENOSPC);
#   - always, under `ulimit -f` (SIGXFSZ ignored): "File too large" (EFBIG).
set -u
ts=$1 manifest=$2 work=$3

fail() {
  echo "FAIL: $*"
  exit 1
}

rm -rf "$work" && mkdir -p "$work/out" || fail "cannot create $work"
python3 - "$manifest" "$work/manifest.json" <<'EOF' || fail "cannot write the tiny manifest"
import json, sys
m = json.load(open(sys.argv[1]))
model = m["models"][0]
model.pop("golden_sha256", None)
model["golden"] = "tiny.h5"
case = {"name": "tiny", "model": model["name"], "prompt": "The", "n_predict": 2}
json.dump({"format_version": 1, "models": [model], "profiles": {}, "cases": [case]},
          open(sys.argv[2], "w"), indent=2)
EOF

# Records into $1 (a directory); prints the output, returns the exit status.
record() {
  "$ts" golden --manifest "$work/manifest.json" --allow-dirty --out "$1" 2>&1
}

# Expects the failed rewrite of "$1/tiny.h5" to exit 2 naming "$2" and to keep
# the previous bytes ("$1/before.h5").
expect_refused_write() {
  local dir=$1 errno_text=$2 out rc
  out=$(eval "$3")
  rc=$?
  echo "$out"
  [ "$rc" = 2 ] || fail "exit status $rc, expected 2"
  grep -q "$errno_text" <<<"$out" || fail "no '$errno_text' in the error"
  cmp -s "$dir/tiny.h5" "$work/before.h5" || fail "the previous golden changed"
  if ls -A "$dir" | grep -q '\.tmp'; then fail "temp file left: $(ls -A "$dir")"; fi
}

# An output directory that cannot be written is refused before recording.
out=$(record "$work/missing")
rc=$?
echo "$out"
[ "$rc" = 2 ] && grep -q "not an existing directory" <<<"$out" || fail "--out to a missing directory"
grep -q "recording goldens" <<<"$out" && fail "recorded before checking --out"

# A temp file of a killed writer (a pid that is not running) is removed.
( exit 0 ) & dead=$!
wait "$dead"
touch "$work/out/.tiny.h5.tmp-$dead"
out=$(record "$work/out") || fail "recording the tiny golden failed: $out"
[ -e "$work/out/.tiny.h5.tmp-$dead" ] && fail "stale temp file not removed"
cp "$work/out/tiny.h5" "$work/before.h5"

# EFBIG: a file-size limit below the golden's size; SIGXFSZ ignored so that
# write() fails instead of killing the process.
expect_refused_write "$work/out" "File too large" \
  '(trap "" XFSZ; ulimit -f 64; record "$work/out")'
echo "ok: file-size limit (EFBIG)"

if [ "$(id -u)" != 0 ] || ! command -v mount >/dev/null; then
  echo "full-disk part not run: needs root to mount a small tmpfs"
  exit 0
fi
mkdir -p "$work/full"
if ! mount -t tmpfs -o size=1m tmpfs "$work/full" 2>/dev/null; then
  echo "full-disk part not run: cannot mount a tmpfs here"
  exit 0
fi
trap 'umount "$work/full"' EXIT
cp "$work/before.h5" "$work/full/tiny.h5"
dd if=/dev/zero of="$work/full/fill" bs=4k 2>/dev/null  # fill the disk
expect_refused_write "$work/full" "No space left on device" 'record "$work/full"'
echo "ok: full disk (ENOSPC)"
