#!/usr/bin/env bash
# tests/fleet/slurm_array.sh TOUCHSTONE MANIFEST BACKEND WEIGHTS N
# A real one-node Slurm cluster on this machine (Debian's slurm-wlm 22.05 +
# munge, configured in a temporary directory, daemons on 127.0.0.1 and free
# ports, stopped at exit): the quick plan submitted as an array job
# (`sbatch --array=0-(N-1) --wait`, each task `touchstone parity --shard auto`),
# the shards merged, and the merged report compared with an unsharded run of
# the same plan (tests/fleet/compare_reports.py). Exit 77 (SKIP) without the
# Slurm / munge programs or without root (slurmd runs jobs as their user);
# under CI=true that is a failure instead (ci/packages/fleet.txt installs them).
set -euo pipefail
ts="$(realpath "$1")" manifest="$(realpath "$2")" backend="$3" weights="$4" n="$5"
here="$(cd "$(dirname "$0")" && pwd)"
skip() {
  if [[ "${CI:-}" == true ]]; then echo "FAIL (CI): $*"; exit 1; fi
  echo "SKIP: $*"; exit 77
}
for p in munged mungekey slurmctld slurmd sbatch scontrol sinfo; do
  command -v "$p" > /dev/null || [[ -x /usr/sbin/$p ]] || skip "$p not installed (Debian: slurm-wlm munge)"
done
[[ $(id -u) == 0 ]] || skip "slurmd must run as root to start jobs"
PATH="$PATH:/usr/sbin"

work="$(mktemp -d /tmp/ts-slurm.XXXXXX)"
chmod 755 "$work"
export SLURM_CONF="$work/slurm.conf"
stop() {
  scontrol shutdown > /dev/null 2>&1 || true
  for f in slurmctld slurmd; do
    [[ -f "$work/$f.pid" ]] && kill "$(cat "$work/$f.pid")" 2> /dev/null || true
  done
  munged -s --socket="$work/munge.sock" > /dev/null 2>&1 || true
  sleep 1
  rm -rf "$work"
}
trap stop EXIT
logs() { for f in "$work"/*.log "$work"/out/*.log; do [[ -f $f ]] && { echo "== $f"; tail -20 "$f"; }; done; }

# munge: its own key and socket.
mungekey -c -k "$work/munge.key"
munged -f --key-file="$work/munge.key" --socket="$work/munge.sock" --pid-file="$work/munged.pid" \
  --log-file="$work/munged.log" --seed-file="$work/munged.seed"

# Two free TCP ports for slurmctld and slurmd.
read -r p1 p2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
host="$(hostname -s)"
mkdir -p "$work/state" "$work/spool" "$work/out"
cat > "$SLURM_CONF" << EOF
ClusterName=touchstone
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$p1
SlurmdPort=$p2
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=touchstone Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
  sinfo -h -o %T 2> /dev/null | grep -q idle && break
  sleep 1
done
sinfo -h -o %T | grep -q idle || { echo "the one-node cluster did not come up"; logs; exit 1; }
sinfo

args=(parity --backend "$backend" --weights "$weights" --manifest "$manifest" --threads 1)
"$ts" "${args[@]}" --json "$work/whole.json" > "$work/whole.txt"
# One array task per shard; each takes its index from SLURM_ARRAY_TASK_ID.
if ! timeout 900 sbatch --wait --array=0-$((n - 1)) -o "$work/out/task-%a.log" -D "$work/out" \
  --wrap "$(printf '%q ' "$ts" "${args[@]}") --shard auto --json $work/out/shard-\$SLURM_ARRAY_TASK_ID.json"; then
  echo "the array job failed"; logs; exit 1
fi
shards=()
for ((i = 0; i < n; i++)); do shards+=("$work/out/shard-$i.json"); done
"$ts" merge "${shards[@]}" --json "$work/merged.json" || { logs; exit 1; }
python3 "$here/compare_reports.py" "$work/whole.json" "$work/merged.json"
python3 - "$work/merged.json" "$n" << 'PY'
import json, sys
m = json.load(open(sys.argv[1]))
idx = sorted(s["index"] for s in m["shards"])
if idx != list(range(int(sys.argv[2]))):
    sys.exit(f"shards merged: {idx}")
print("array tasks:", ", ".join(f"{s['index']} on {s['host']} ({len(s['items'])} items)" for s in m["shards"]))
PY
