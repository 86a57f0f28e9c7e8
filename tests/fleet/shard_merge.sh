#!/usr/bin/env bash
# tests/fleet/shard_merge.sh TOUCHSTONE MANIFEST BACKEND WEIGHTS N [SCHEDULER]
# A plan run whole and as N shards on this machine: `touchstone merge` of the
# shards must give the unsharded report's rows (every field but the seconds),
# verdict and count of checks; a shard missing is INCOMPLETE (exit 1), a shard
# given twice refused (exit 2). SCHEDULER=slurm / k8s / buildkite: the index
# comes from that scheduler's environment variables (--shard auto[/N]).
set -euo pipefail
ts="$1" manifest="$2" backend="$3" weights="$4" n="$5" scheduler="${6:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
run() { "$ts" parity --backend "$backend" --weights "$weights" --manifest "$manifest" "$@"; }

run --json "$work/whole.json" --durations "$work/durations.json" > "$work/whole.txt"
shards=()
for ((i = 0; i < n; i++)); do
  case "$scheduler" in
    slurm) env SLURM_ARRAY_TASK_ID=$((i + 5)) SLURM_ARRAY_TASK_MIN=5 SLURM_ARRAY_TASK_COUNT="$n" \
             "$ts" parity --backend "$backend" --weights "$weights" --manifest "$manifest" \
             --shard auto --durations "$work/durations.json" --json "$work/s$i.json" > "$work/s$i.txt" ;;
    k8s) env JOB_COMPLETION_INDEX=$i "$ts" parity --backend "$backend" --weights "$weights" \
           --manifest "$manifest" --shard "auto/$n" --durations "$work/durations.json" \
           --json "$work/s$i.json" > "$work/s$i.txt" ;;
    *) run --shard "$i/$n" --durations "$work/durations.json" --json "$work/s$i.json" > "$work/s$i.txt" ;;
  esac
  shards+=("$work/s$i.json")
done
"$ts" merge "${shards[@]}" --json "$work/merged.json"
python3 "$(dirname "$0")/compare_reports.py" "$work/whole.json" "$work/merged.json"
rc=0; "$ts" merge "${shards[@]:1}" > "$work/missing.txt" || rc=$?
[[ $rc == 1 ]] && grep -q "shard 0 of $n is missing" "$work/missing.txt" \
  || { echo "a missing shard: exit $rc, expected 1 and INCOMPLETE"; cat "$work/missing.txt"; exit 1; }
rc=0; "$ts" merge "${shards[@]}" "${shards[0]}" > "$work/twice.txt" 2>&1 || rc=$?
[[ $rc == 2 ]] && grep -q "are both shard 0 of $n" "$work/twice.txt" \
  || { echo "a shard twice: exit $rc, expected 2"; cat "$work/twice.txt"; exit 1; }
echo "missing shard: INCOMPLETE (exit 1); shard twice: refused (exit 2)"
