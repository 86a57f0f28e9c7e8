#!/usr/bin/env python3
"""model/vision against Pillow and numpy, bit for bit (docs/vision.md).

For every input image (the real photographs of tests/vision/images.json and
generated ones that stress the arithmetic: noise at odd sizes, extreme aspect
ratios, a 1 x 1 image, gray, palette and RGBA files) and every convolution filter
(box, bilinear, hamming, bicubic, lanczos), `touchstone image --resize` must
write exactly the bytes of PIL's Image.open(f).convert(mode).resize(size, filter)
for a downscale and an upscale; `touchstone image --processor gemma3` must write
exactly the float32 pixel values of transformers.image_transforms' numpy steps
(resize through PIL, rescale in float64 then float32, normalise in float32).

    pillow_crosscheck.py TOUCHSTONE IMAGE_DIR WORK_DIR

IMAGE_DIR: the model cache holding the photographs (ci/bootstrap). Exit 0: all
identical; 1: a difference (the image, filter, size and first differing pixel
are printed); 77: Pillow or numpy is missing (a failure under CI=true).
"""
import json
import os
import subprocess
import sys

try:
    import numpy as np
    from PIL import Image
except ImportError as e:  # pragma: no cover - environment
    print(f"pillow_crosscheck: {e} (Debian: python3-pil python3-numpy)")
    sys.exit(1 if os.environ.get("CI") == "true" else 77)

FILTERS = {"box": Image.BOX, "bilinear": Image.BILINEAR, "hamming": Image.HAMMING,
           "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS}
HERE = os.path.dirname(os.path.abspath(__file__))


def generated(work):
    """(name, path) of the generated inputs, written as PNG files."""
    rng = np.random.default_rng(20261201)
    out = []

    def save(name, im):
        p = os.path.join(work, name + ".png")
        im.save(p)
        out.append((name, p))

    save("noise_37x23", Image.fromarray(rng.integers(0, 256, (23, 37, 3), dtype=np.uint8)))
    save("wide_1000x3", Image.fromarray(rng.integers(0, 256, (3, 1000, 3), dtype=np.uint8)))
    save("tall_2x517_gray", Image.fromarray(rng.integers(0, 256, (517, 2), dtype=np.uint8), "L"))
    save("one_pixel", Image.fromarray(np.array([[[250, 3, 128]]], dtype=np.uint8)))
    edges = np.zeros((64, 64, 3), dtype=np.uint8)
    edges[:, 32:] = 255  # a step edge: where bicubic and lanczos ring (negative weights)
    edges[::7] = [255, 0, 0]
    save("edges_64", Image.fromarray(edges))
    save("palette_50x40", Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8))
         .convert("P", palette=Image.ADAPTIVE, colors=16))
    rgba = rng.integers(0, 256, (30, 45, 4), dtype=np.uint8)
    save("rgba_45x30", Image.fromarray(rgba, "RGBA"))
    save("gray_alpha_31x40", Image.fromarray(rng.integers(0, 256, (40, 31, 2), dtype=np.uint8), "LA"))
    trns = os.path.join(work, "palette_trns_48x33.png")  # one transparent palette entry (tRNS)
    Image.fromarray(rng.integers(0, 256, (33, 48, 3), dtype=np.uint8)).convert(
        "P", palette=Image.ADAPTIVE, colors=16).save(trns, transparency=3)
    out.append(("palette_trns_48x33", trns))
    return out


def sizes(w, h):
    """A downscale to an odd size and an upscale, per input."""
    return [(max(1, w // 3 + 1), max(1, h // 2 + 1)), (w * 2 + 3, h + 5)]


def pil_open(path):
    im = Image.open(path)
    return im.convert("L" if im.mode in ("L", "LA") else "RGB")


def first_difference(a, b):
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    idx = np.argwhere(a != b)
    if len(idx) == 0:
        return None
    i = tuple(idx[0])
    return f"{len(idx)} values differ; first at {i}: touchstone {a[i]} vs reference {b[i]}"


def check_resize(touchstone, name, path, work):
    src = pil_open(path)
    failures = 0
    for fname, fcode in FILTERS.items():
        for w, h in sizes(*src.size):
            out = os.path.join(work, f"{name}.{fname}.{w}x{h}.png")
            subprocess.run([touchstone, "image", "--in", path, "--resize", f"{w}x{h}", "--filter",
                            fname, "--out", out], check=True)
            diff = first_difference(np.asarray(Image.open(out)),
                                    np.asarray(src.resize((w, h), fcode)))
            if diff:
                failures += 1
                print(f"FAIL resize {name} {fname} {src.size} -> {w}x{h}: {diff}")
    return failures


def hf_convert_to_rgb(im):
    """transformers.image_transforms.convert_to_rgb: RGB as it is, any other mode through
    RGBA alpha-composited over opaque white (a transparent pixel becomes white)."""
    if im.mode == "RGB":
        return im
    rgba = im.convert("RGBA")
    return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255)), rgba).convert("RGB")


def hf_pixels(path, size, resample, factor, mean, std):
    """transformers.image_transforms' numpy steps: convert_to_rgb, resize (PIL, uint8),
    rescale (float64 multiply, then float32), normalize (float32), channels first."""
    im = np.asarray(hf_convert_to_rgb(Image.open(path)).resize(size, resample))
    v = (im.astype(np.float64) * factor).astype(np.float32)
    v = (v - np.array(mean, dtype=np.float32)) / np.array(std, dtype=np.float32)
    return v.transpose(2, 0, 1)


def check_processor(touchstone, name, path, work):
    out = os.path.join(work, f"{name}.gemma3.f32")
    r = subprocess.run([touchstone, "image", "--in", path, "--processor", "gemma3", "--out", out],
                       check=True, capture_output=True, text=True)
    shape = json.loads(r.stdout)["shape"]
    got = np.fromfile(out, dtype="<f4").reshape(shape)
    want = hf_pixels(path, (896, 896), Image.BILINEAR, 0.00392156862745098, [0.5] * 3, [0.5] * 3)
    diff = first_difference(got.view(np.uint32), want.view(np.uint32))
    if diff:
        print(f"FAIL processor gemma3 {name}: {diff}")
        return 1
    return 0


def main(touchstone, image_dir, work):
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(HERE, "images.json")) as f:
        photos = [(m["name"], os.path.join(image_dir, m["filename"])) for m in json.load(f)["images"]]
    missing = [p for _, p in photos if not os.path.exists(p)]
    if missing:
        print(f"pillow_crosscheck: missing {', '.join(missing)} (ci/bootstrap fetches them)")
        return 1
    inputs = photos + generated(work)
    failures = sum(check_resize(touchstone, n, p, work) for n, p in inputs)
    failures += sum(check_processor(touchstone, n, p, work) for n, p in inputs)
    import PIL
    print(f"pillow_crosscheck: {len(inputs)} images x {len(FILTERS)} filters x 2 sizes, and the "
          f"gemma3 processor on all {len(inputs)}, against Pillow {PIL.__version__} and "
          f"numpy {np.__version__}: {failures} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
