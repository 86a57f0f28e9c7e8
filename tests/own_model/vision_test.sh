#!/usr/bin/env bash
# docs/own-model.md, "A vision-language model": a cases file with an image case whose
# PNG and mmproj are given relative to it and without their sha256 (touchstone fills
# them in), for the Idefics3 test model (tests/models/vision); the goldens recorded, then
# cpu_simd must pass the image case. A missing image file must be an error naming it
# (exit 2), with no manifest written.
#   vision_test.sh TOUCHSTONE_BIN_DIR VISION_MODELS_DIR
set -euo pipefail
bin=$1 vis=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/in/pictures"
cp "$vis/images/astronaut-96x80.png" "$work/in/pictures/photo.png"
cp "$vis/mmproj-idefics3vl-test-f32.gguf" "$work/in/mmproj.gguf"
cat > "$work/in/cases.json" <<'JSON'
{
  "cases": [
    {"name": "describe", "prompt": "User:<image>Describe this image.\nAssistant:", "n_predict": 8,
     "image": {"file": "pictures/photo.png", "mmproj": "mmproj.gguf"}},
    {"name": "story", "prompt": "Once upon a time", "n_predict": 8}
  ]
}
JSON
cd "$work"
"$bin/touchstone" golden --model "$vis/idefics3vl-test-f32.gguf" --cases in/cases.json \
  --out goldens --name my-vlm
grep -q '"mmproj_sha256"' goldens/manifest.json
"$bin/touchstone" parity --goldens goldens --backend cpu_simd --weights quantized --threads 1 \
  --no-serving --no-consistency | tee parity.txt
grep -E -q '^cpu_simd +describe +PASS' parity.txt || { echo "the image case did not PASS" >&2; exit 1; }
# A missing PNG: exit 2 naming it, no manifest written.
sed 's|pictures/photo.png|pictures/missing.png|' in/cases.json > in/bad.json
rc=0
"$bin/touchstone" golden --model "$vis/idefics3vl-test-f32.gguf" --cases in/bad.json \
  --out bad-goldens --name my-vlm 2> err.txt || rc=$?
cat err.txt
[ "$rc" -eq 2 ] && grep -q "missing.png" err.txt && [ ! -e bad-goldens/manifest.json ] ||
  { echo "a missing image: exit $rc, want 2 naming the file and no manifest" >&2; exit 1; }
echo "own-model vision test passed"
