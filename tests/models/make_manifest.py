#!/usr/bin/env python3
"""Writes tests/models/manifest.json (or DIR/manifest.json for `make_manifest.py DIR`,
e.g. tests/models/moe, the mixture-of-experts models): one manifest model per converted test model
(tests/models/*.gguf, pinned by SHA256SUMS, found by a manifest-relative "path"),
two cases and a short scoring passage each. A model with an mmproj beside it
(mmproj-<name>.gguf, tests/models/vision) also gets one image case per PNG in images/
(docs/vision.md) with its family's prompt and choices (VISION below). Goldens: `touchstone
golden --manifest tests/models/manifest.json` (tests/models/goldens/<name>.h5), which also
pins each golden's sha256 in the manifest. The profiles are the project's
(goldens/manifest.json)."""
import json, os, sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
here = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
sums = {}
with open(os.path.join(here, "SHA256SUMS")) as f:
    for line in f:
        sha, name = line.split()
        if name.endswith(".gguf") and "/" not in name:
            sums[name] = sha
images = sorted(os.listdir(os.path.join(here, "images"))) if os.path.isdir(
    os.path.join(here, "images")) else []


# Vision-language models, by name prefix: the image prompt (the placeholder where the
# processor's image text goes), whether the model gets the one_token text case, and the
# images it leaves out. Gemma 3: the image between <start_of_image> and <end_of_image>;
# Idefics3: SmolVLM's chat layout, no one_token (its image cases fill the plan), and every
# image (strip-240x24 is a tile-grid case: Gemma 3 only stretches it).
VISION = {
    "gemma3vl": {"prompt": "Look at this: <start_of_image><image><end_of_image> It shows",
                 "one_token": True, "skip": ("strip-",)},
    "idefics3vl": {"prompt": "User:<image>Describe this image.\nAssistant:",
                   "one_token": False, "skip": ()},
}
TEXT = {"prompt": "", "one_token": True, "skip": ()}


def sha256_of(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
with open(os.path.join(root, "goldens", "manifest.json")) as f:
    profiles = json.load(f)["profiles"]
models, cases, scoring = [], [], []
for name in sorted(sums):
    if name.startswith("mmproj-"):  # a vision tower, not a text model
        continue
    m = name[:-len(".gguf")]
    family = next((v for k, v in VISION.items() if m.startswith(k)), TEXT)
    models.append({"name": m, "path": name, "filename": name, "sha256": sums[name],
                   "golden": f"goldens/{m}.h5"})
    cases.append({"name": f"{m}.story", "model": m, "prompt": "Once upon a time, in a small village",
                  "n_predict": 16})
    if family["one_token"]:
        cases.append({"name": f"{m}.one_token", "model": m, "prompt": "The", "n_predict": 16})
    scoring.append({"name": f"{m}.passage", "model": m, "text_file": "passages/short.txt"})
    mmproj = f"mmproj-{name}"
    for png in images if mmproj in sums else []:
        if png.startswith(family["skip"]):
            continue
        cases.append({"name": f"{m}.image-{png[:-len('.png')]}", "model": m,
                      "prompt": family["prompt"], "n_predict": 8, "tags": ["image"],
                      "image": {"file": f"images/{png}",
                                "sha256": sha256_of(os.path.join(here, "images", png)),
                                "mmproj": mmproj, "mmproj_sha256": sums[mmproj]}})
manifest = {"format_version": 1, "models": models, "profiles": profiles, "cases": cases,
            "scoring": scoring}
with open(os.path.join(here, "manifest.json"), "w") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
print(f"wrote {len(models)} models")
