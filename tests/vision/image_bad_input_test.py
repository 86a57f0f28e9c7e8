#!/usr/bin/env python3
"""Bad image input to `touchstone golden` (docs/vision.md): each a clear error, exit 2.

Usage: image_bad_input_test.py TOUCHSTONE VISION_DIR

Every variant is one image case of the vision test model (tests/models/vision) changed
in a scratch copy of its manifest: the PNG's sha256 wrong, a truncated PNG, a file that
is not a PNG, a text model given as the mmproj, another model's mmproj (Idefics3's,
whose processor writes "<image>" tokens the Gemma 3 tokenizer does not have), and a
prompt whose image no longer fits the model's context. Each must
exit 2 naming the file (or the case and the image) and what is wrong, and write no
golden file.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

CASE = "gemma3vl-test-f32.image-astronaut-96x80"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def variants(d):
    """(name, edit of the case's image dict and prompt, substrings the error must hold)."""
    png = os.path.join(d, "images", "astronaut-96x80.png")
    with open(png, "rb") as f:
        good = f.read()
    with open(os.path.join(d, "images", "half.png"), "wb") as f:
        f.write(good[: len(good) // 2])
    with open(os.path.join(d, "images", "gif.png"), "wb") as f:
        f.write(b"GIF89a not a png")

    def image(**kw):
        def edit(case):
            case["image"].update(kw)
            for key in ("file", "mmproj"):
                if key in kw:
                    case["image"][key + "_sha256" if key == "mmproj" else "sha256"] = sha256(
                        os.path.join(d, kw[key]))
            if kw.get("sha256"):
                case["image"]["sha256"] = kw["sha256"]
        return edit

    def long_prompt(case):
        case["prompt"] = "word " * 78 + case["prompt"]  # the text fits, the image does not

    return [
        ("wrong_sha256", image(sha256="0" * 64), ["astronaut-96x80.png", "0" * 64]),
        ("truncated_png", image(file="images/half.png"), ["half.png", "truncated"]),
        ("not_a_png", image(file="images/gif.png"), ["gif.png", "not a PNG"]),
        ("text_model_as_mmproj", image(mmproj="gemma3vl-test-f32.gguf"),
         ["gemma3vl-test-f32.gguf", "not an mmproj"]),
        ("another_models_mmproj", image(mmproj="mmproj-idefics3vl-test-f32.gguf"),
         ["mmproj-idefics3vl-test-f32.gguf", "gemma3vl-test-f32", "has no \"<image>\" token"]),
        ("image_beyond_context", long_prompt,
         [CASE, "astronaut-96x80.png", "16 tokens", "context"]),
    ]


def main():
    touchstone, src = sys.argv[1], os.path.abspath(sys.argv[2])
    failures = []
    with tempfile.TemporaryDirectory() as d:
        for entry in os.listdir(src):
            if entry in ("manifest.json", "images", "goldens"):
                continue
            os.symlink(os.path.join(src, entry), os.path.join(d, entry))
        os.mkdir(os.path.join(d, "images"))
        for entry in os.listdir(os.path.join(src, "images")):
            os.symlink(os.path.join(src, "images", entry), os.path.join(d, "images", entry))
        out = os.path.join(d, "out")
        os.makedirs(os.path.join(out, "goldens"))
        with open(os.path.join(src, "manifest.json")) as f:
            base = json.load(f)
        for name, edit, needles in variants(d):
            m = json.loads(json.dumps(base))
            case = next(c for c in m["cases"] if c["name"] == CASE)
            edit(case)
            path = os.path.join(d, f"manifest-{name}.json")
            with open(path, "w") as f:
                json.dump(m, f)
            r = subprocess.run([touchstone, "golden", "--manifest", path, "--model",
                                "gemma3vl-test-f32", "--only", CASE, "--allow-dirty", "--out", out],
                               capture_output=True, text=True, timeout=300)
            err = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
            missing = [n for n in needles if n not in err]
            written = os.listdir(os.path.join(out, "goldens"))
            verdict = "ok" if r.returncode == 2 and not missing and not written else "FAIL"
            print(f"{verdict:4} {name}: exit {r.returncode}: {err}")
            if verdict != "ok":
                failures.append(f"{name}: exit {r.returncode} (want 2), missing {missing}, "
                                f"golden files written {written}")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
