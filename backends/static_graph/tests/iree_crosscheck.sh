#!/usr/bin/env bash
# IREE cross-check of the exported decode module: the same decode step compiled
# by iree-compile (llvm-cpu) and run by iree-run-module must give the logits the
# in-process MLIR JIT gave (check/expected_logits.npy). SKIPs (77) without IREE.
# usage: iree_crosscheck.sh EXPORTER WORKDIR
set -euo pipefail
exporter=$1
work=$2
model=${TOUCHSTONE_MODEL_DIR:-$HOME/.cache/touchstone/models}/SmolLM2-135M-Instruct.Q4_1.gguf
IREE_COMPILE=${IREE_COMPILE:-$(command -v iree-compile || true)}
IREE_RUN=${IREE_RUN_MODULE:-$(command -v iree-run-module || true)}
if [[ -z "$IREE_COMPILE" || -z "$IREE_RUN" ]]; then
  echo "SKIP: iree-compile / iree-run-module not found (pip install -r ci/requirements-iree.txt)"
  exit 77
fi
if [[ ! -f "$model" ]]; then
  echo "SKIP: model not found: $model"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
"$exporter" --model "$model" --out "$work/export" --capacity 64 --no-prefill
cd "$work/export"
"$IREE_COMPILE" --iree-hal-target-device=local --iree-hal-local-target-device-backends=llvm-cpu \
  --iree-llvmcpu-target-cpu=host decode.mlir -o decode.vmfb
# Inputs in signature order (manifest.json), weights from weights/, the rest from check/.
args=$(python3 - <<'PY'
import json
m = json.load(open("manifest.json"))["modules"][0]
out = []
for a in m["args"]:
    f = a.get("file")
    if f is None:
        f = "check/%s.npy" % a["name"]  # tokens, pos, rope tables, k_cache.<l>, v_cache.<l>
    out.append("--input=@" + f)
print(" ".join(out))
PY
)
"$IREE_RUN" --device=local-task --module=decode.vmfb --function=step $args --output=@iree_logits.npy \
  $(python3 -c "import json;m=json.load(open('manifest.json'))['modules'][0];print(' '.join('--output=' for r in m['results'][1:]))") > /dev/null
python3 - <<'PY'
import numpy as np
a = np.load("iree_logits.npy").reshape(-1).astype(np.float64)
b = np.load("check/expected_logits.npy").reshape(-1).astype(np.float64)
d = np.abs(a - b).max()
nmse = ((a - b) ** 2).sum() / (b ** 2).sum()
print(f"IREE vs in-process JIT: max|d| = {d:.3e}, NMSE = {nmse:.3e}, argmax {a.argmax()} vs {b.argmax()}")
raise SystemExit(0 if (d <= 1e-3 and a.argmax() == b.argmax()) else 1)
PY
