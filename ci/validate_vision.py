#!/usr/bin/env python3
"""The reference's vision tower against Hugging Face transformers, on the tiny
vision-language test model converted by llama.cpp's own converter
(tools/make-test-models/make-test-models --vision: a seeded random
Gemma3ForConditionalGeneration, SigLIP tower + Gemma 3 projector, and its mmproj GGUF).

For every image (scikit-image's three photographs, pinned by tests/vision/images.json
and fetched by ci/bootstrap, and generated ones that stress preprocessing: odd sizes, an
extreme aspect ratio, gray, RGBA), three stages are compared:

* pixels: `touchstone image --mmproj M --stage pixels` against the model's own HF image
  processor (Gemma3ImageProcessorPil, the PIL backend) on the ORIGINAL preprocessor
  config: must be bit-identical;
* patches: `--stage patches` (the SigLIP encoder's output, post-LayerNorm) against
  `model.vision_tower(pixel_values).last_hidden_state`;
* embeddings: `--stage embeddings` (the projector's output) against
  `model.get_image_features(pixel_values)`;
  NMSE = sum((ref - hf)^2) / sum(hf^2) <= 1e-10 for both, in float64. HF runs the
  ORIGINAL safetensors (DIR/hf/gemma3vl/), fp32, eager attention, CPU, 1 thread, fed
  its own pixel values.
A control column gives the NMSE between this image's HF embeddings and the next
image's: what a wrong image (or a broken tower) looks like on this metric.

Then the decoder with the image: the Gemma 3 model's logits at every position of a
prompt `<bos> t t t <start_of_image> [16 image tokens] <end_of_image> t t t t t` (fixed
ids), `touchstone-vlm-reference` (the tower, then the reference decoder with the image's
tokens attended bidirectionally, prefill_embeddings) against HF's forward with the same
ids, pixel values and token_type_ids (1 on the image tokens: Gemma 3's bidirectional
image mask); NMSE over all positions <= 1e-10 and the argmax identical at every
position. Control: HF without token_type_ids (the image attended causally).

Then the tiny Idefics3ForConditionalGeneration (SmolVLM's architecture: SigLIP-style
tower, pixel-shuffle connector): its processor splits each image into tiles plus a
global view (touchstone/vision/image_splitting.h); every frame's pixel values must be
bit-identical to HF's, and the patches and embeddings of each frame are compared with
`vision_model(...)` and `connector(...)` on HF's pixel values (worst frame reported).
Then its decoder with an image's frames in the prompt: the processor's text for the
image (touchstone-vlm-reference --layout-out) must equal HF's
Idefics3Processor.replace_image_token on HF's rows and columns, and every position's
logits of the prompt HF's tokenizer makes (`--image-token 5`: each run of <image> one
frame, attended causally) must match Idefics3ForConditionalGeneration's on the same ids
and pixel values (NMSE <= 1e-10, argmax identical). Control: the frames rotated by one.

    ci/validate_vision.py [--models-dir DIR] [--touchstone BIN] [--write-doc docs/validation.md]

DIR: make-test-models --vision's output (default ~/.cache/touchstone/test-models-vision).
Run it in ~/.cache/touchstone/venv-testmodels (or venv-validate). Exit 0: all pass;
1: a stage disagrees; 2: setup error (77: the model or the venv is missing).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- validate-vision:begin -->", "<!-- validate-vision:end -->"
NAME = "gemma3vl"
NMSE_MAX = 1e-10


def generated_images(out: Path) -> list[Path]:
    """Images that stress preprocessing, from a fixed seed."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(7)
    made = []
    for name, shape, mode in [("noise-37x23", (23, 37, 3), "RGB"), ("wide-300x7", (7, 300, 3), "RGB"),
                              ("gray-50x50", (50, 50), "L"), ("rgba-65x64", (64, 65, 4), "RGBA")]:
        p = out / f"{name}.png"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(p)
        made.append(p)
    # Gray + alpha, and a 16-colour palette with one transparent entry (tRNS).
    p = out / "gray-alpha-31x40.png"
    Image.fromarray(rng.integers(0, 256, (40, 31, 2), dtype=np.uint8), "LA").save(p)
    made.append(p)
    p = out / "palette-trns-48x33.png"
    rgb = Image.fromarray(rng.integers(0, 256, (33, 48, 3), dtype=np.uint8), "RGB")
    rgb.convert("P", palette=Image.ADAPTIVE, colors=16).save(p, transparency=3)
    made.append(p)
    return made


def photos() -> list[Path]:
    spec = json.loads((ROOT / "tests" / "vision" / "images.json").read_text())
    cache = Path(os.environ.get("TOUCHSTONE_MODEL_CACHE", Path.home() / ".cache" / "touchstone" / "models"))
    return [cache / im["filename"] for im in spec["images"] if (cache / im["filename"]).exists()]


def touchstone_stage(bin_: str, image: Path, mmproj: Path, stage: str, tmp: Path, pixels: bool = False):
    import numpy as np
    out = tmp / f"{image.stem}.{stage}.f32"
    r = subprocess.run([bin_, "image", "--pixels" if pixels else "--in", str(image), "--mmproj", str(mmproj),
                        "--stage", stage, "--out", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"touchstone image failed on {image}: {r.stderr}")
    shape = json.loads(r.stdout)["shape"]
    return np.fromfile(out, dtype=np.float32).reshape(shape)


def nmse(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a - b) ** 2).sum() / (b ** 2).sum())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".cache" / "touchstone" / "test-models-vision")
    ap.add_argument("--touchstone", default=str(ROOT / "build" / "default" / "bin" / "touchstone"))
    ap.add_argument("--vlm-reference", default=str(ROOT / "build" / "default" / "bin" / "touchstone-vlm-reference"))
    ap.add_argument("--write-doc", type=Path)
    args = ap.parse_args()
    hf_dir, mmproj = args.models_dir / "hf" / NAME, args.models_dir / f"mmproj-{NAME}-test-f32.gguf"
    if not hf_dir.is_dir() or not mmproj.exists():
        print(f"no {hf_dir} or {mmproj}: run tools/make-test-models/make-test-models --vision --out "
              f"{args.models_dir}", file=sys.stderr)
        return 77
    try:
        import numpy as np
        import torch
        import transformers
        from PIL import Image
    except ImportError as e:
        print(f"validate_vision: {e} (run in ~/.cache/touchstone/venv-testmodels)", file=sys.stderr)
        return 77
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    proc = transformers.AutoImageProcessor.from_pretrained(hf_dir, backend="pil")
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    rows, ok, hf_emb = [], True, []
    generated = tempfile.TemporaryDirectory()   # the generated images, for every section
    images = photos() + generated_images(Path(generated.name))
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for image in images:
            pv = proc(images=Image.open(image), return_tensors="pt")["pixel_values"]
            with torch.no_grad():
                patches = model.model.vision_tower(pixel_values=pv).last_hidden_state[0].double().numpy()
                feats = model.model.get_image_features(pixel_values=pv)
                feats = getattr(feats, "pooler_output", feats)
                feats = (feats[0] if isinstance(feats, (list, tuple)) else feats)
                feats = feats.reshape(-1, feats.shape[-1]).double().numpy()
            px = touchstone_stage(args.touchstone, image, mmproj, "pixels", tmp)
            pt = touchstone_stage(args.touchstone, image, mmproj, "patches", tmp)
            em = touchstone_stage(args.touchstone, image, mmproj, "embeddings", tmp)
            px = px[0] if px.shape[0] == 1 else px   # one frame: [1, 3, H, W]
            same_px = px.shape == tuple(pv[0].shape) and np.array_equal(px.view(np.uint32), pv[0].numpy().view(np.uint32))
            r = dict(image=image.name, size=f"{Image.open(image).size[0]} x {Image.open(image).size[1]}",
                     mode=Image.open(image).mode, pixels_identical=bool(same_px),
                     patches_nmse=nmse(pt, patches), patches_max=float(np.abs(pt - patches).max()),
                     emb_nmse=nmse(em, feats), emb_max=float(np.abs(em - feats).max()))
            r["pass"] = same_px and r["patches_nmse"] <= NMSE_MAX and r["emb_nmse"] <= NMSE_MAX
            ok &= r["pass"]
            rows.append(r)
            hf_emb.append(feats)
    for i, r in enumerate(rows):
        r["control_nmse"] = nmse(hf_emb[(i + 1) % len(hf_emb)], hf_emb[i])
    for r in rows:
        print(f"{r['image']:38s} {r['size']:>10s} {r['mode']:4s} pixels {'identical' if r['pixels_identical'] else 'DIFFER'}"
              f"  patches NMSE {r['patches_nmse']:.1e} max {r['patches_max']:.1e}"
              f"  embeddings NMSE {r['emb_nmse']:.1e} max {r['emb_max']:.1e}"
              f"  (next image {r['control_nmse']:.2f})  {'PASS' if r['pass'] else 'FAIL'}")
    rows_dec = decoder_rows(args, model, proc, photos() + [p for p in images if "rgba" in p.name])
    for r in rows_dec:
        print(f"decoder {r['image']:30s} {r['positions']} positions  logits NMSE {r['nmse']:.1e} max {r['max']:.1e}"
              f"  argmax {'identical' if r['argmax_same'] else 'DIFFER'}  (causal image {r['causal_nmse']:.2f})"
              f"  {'PASS' if r['pass'] else 'FAIL'}")
    ok &= all(r["pass"] for r in rows_dec)
    rows3 = idefics3_rows(args, images)
    for r in rows3:
        print(f"idefics3 {r['image']:29s} {r['tiles']:3d} frames  pixels {'identical' if r['pixels_identical'] else 'DIFFER'}"
              f"  patches NMSE {r['patches_nmse']:.1e}"
              f"  embeddings NMSE {r['emb_nmse']:.1e}  {'PASS' if r['pass'] else 'FAIL'}")
    ok &= all(r["pass"] for r in rows3)
    rows3d = idefics3_decoder_rows(args, photos() + [p for p in images if p.name.startswith(("wide", "gray-50"))])
    for r in rows3d:
        print(f"idefics3 decoder {r['image']:21s} {r['frames']:3d} frames {r['positions']} positions"
              f"  layout {'identical' if r['layout_same'] else 'DIFFERS'}  logits NMSE {r['nmse']:.1e} max {r['max']:.1e}"
              f"  argmax {'identical' if r['argmax_same'] else 'DIFFER'}  (frames rotated {r['rotated_nmse']:.2e})"
              f"  {'PASS' if r['pass'] else 'FAIL'}")
    ok &= all(r["pass"] for r in rows3d)
    if args.write_doc:
        write_doc(args.write_doc, rows, rows_dec, rows3, rows3d, transformers.__version__, torch.__version__)
    return 0 if ok else 1


HEAD_IDS, TAIL_IDS = [1, 45, 67, 89, 3], [4, 120, 33, 7, 200, 311]   # 3 = <start_of_image>, 4 = <end_of_image>
IMAGE_TOKEN = 5


def decoder_rows(args, model, proc, images: list[Path]) -> list[dict]:
    """Every position's logits with the image inserted: the reference against HF."""
    import numpy as np
    import torch
    from PIL import Image
    mmproj = args.models_dir / f"mmproj-{NAME}-test-f32.gguf"
    text = args.models_dir / f"{NAME}-test-f32.gguf"
    n_img = model.config.mm_tokens_per_image
    rows = []
    with tempfile.TemporaryDirectory() as t:
        for image in images:
            out = Path(t) / "logits.f32"
            r = subprocess.run([args.vlm_reference, "--mmproj", str(mmproj), "--model", str(text), "--in", str(image),
                                "--ids", ",".join(map(str, HEAD_IDS + TAIL_IDS)), "--image-at", str(len(HEAD_IDS)),
                                "--out", str(out)], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"touchstone-vlm-reference failed on {image}: {r.stderr}")
            ours = np.fromfile(out, np.float32).reshape(json.loads(r.stdout)["shape"]).astype(np.float64)
            ids = torch.tensor([HEAD_IDS + [IMAGE_TOKEN] * n_img + TAIL_IDS])
            pv = proc(images=Image.open(image), return_tensors="pt")["pixel_values"]
            with torch.no_grad():
                hf = model(input_ids=ids, pixel_values=pv, token_type_ids=(ids == IMAGE_TOKEN).long()).logits[0]
                causal = model(input_ids=ids, pixel_values=pv).logits[0].double().numpy()
            hf = hf.double().numpy()
            rr = dict(image=image.name, positions=int(ours.shape[0]), nmse=nmse(ours, hf),
                      max=float(np.abs(ours - hf).max()),
                      argmax_same=bool((ours.argmax(-1) == hf.argmax(-1)).all()),
                      causal_nmse=nmse(causal, hf))
            rr["pass"] = rr["nmse"] <= NMSE_MAX and rr["argmax_same"]
            rows.append(rr)
    return rows


def idefics3_rows(args, images: list[Path]) -> list[dict]:
    """Every frame of every image (the tiles and the global view of Idefics3's image
    splitting): the reference's pixel values against HF's processor (bit for bit), and
    its tower and connector against HF's `vision_model` and `connector` on HF's pixel
    values (worst frame reported)."""
    import numpy as np
    import torch
    import transformers
    from PIL import Image
    hf, mmproj = args.models_dir / "hf" / "idefics3vl", args.models_dir / "mmproj-idefics3vl-test-f32.gguf"
    if not hf.is_dir() or not mmproj.exists():
        raise SystemExit(f"no {hf} or {mmproj}: run tools/make-test-models/make-test-models --vision")
    proc = transformers.AutoImageProcessor.from_pretrained(hf, backend="pil")
    model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager").eval()
    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for image in images:
            pv = proc(images=Image.open(image), return_tensors="pt")["pixel_values"][0]   # [frames, 3, M, M]
            px = touchstone_stage(args.touchstone, image, mmproj, "pixels", tmp)
            pt = touchstone_stage(args.touchstone, image, mmproj, "patches", tmp)
            em = touchstone_stage(args.touchstone, image, mmproj, "embeddings", tmp)
            same_px = px.shape == tuple(pv.shape) and np.array_equal(px.view(np.uint32), pv.numpy().view(np.uint32))
            n = pv.shape[0]
            with torch.no_grad():
                mask = torch.ones((n, pv.shape[2] // 8, pv.shape[3] // 8), dtype=torch.bool)
                h = model.model.vision_model(pixel_values=pv, patch_attention_mask=mask).last_hidden_state
                e = model.model.connector(h).double().numpy()
                h = h.double().numpy()
            pt, em = pt.reshape(h.shape), em.reshape(e.shape)
            worst_p = max(nmse(pt[i], h[i]) for i in range(n))
            worst_e = max(nmse(em[i], e[i]) for i in range(n))
            rows.append(dict(image=image.name, tiles=int(n), pixels_identical=bool(same_px), patches_nmse=worst_p,
                             emb_nmse=worst_e,
                             **{"pass": same_px and worst_p <= NMSE_MAX and worst_e <= NMSE_MAX}))
    return rows


IDEFICS3_IMAGE_TOKEN = 5   # "<image>" in the Idefics3 test tokenizer
IDEFICS3_PROMPT = "User:<image>Describe this image.\nAssistant:"


def idefics3_decoder_rows(args, images: list[Path]) -> list[dict]:
    """The Idefics3 decoder with an image's tiles and global view in its prompt: the
    processor's text for the image (touchstone-vlm-reference --layout-out against HF's
    Idefics3Processor.replace_image_token on HF's rows and cols), then every position's
    logits of the prompt HF's tokenizer makes of it, the reference (--image-token: each
    run of <image> one frame, attended causally) against HF's forward on the same ids and
    pixel values. Control: HF with the frames rotated by one (a tile-order bug)."""
    import numpy as np
    import torch
    import transformers
    from PIL import Image
    hf = args.models_dir / "hf" / "idefics3vl"
    mmproj, text = args.models_dir / "mmproj-idefics3vl-test-f32.gguf", args.models_dir / "idefics3vl-test-f32.gguf"
    if not text.exists():
        raise SystemExit(f"no {text}: run tools/make-test-models/make-test-models --vision")
    iproc = transformers.AutoImageProcessor.from_pretrained(hf, backend="pil")
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    proc = transformers.Idefics3Processor(image_processor=iproc, tokenizer=tok, image_seq_len=16)
    model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager").eval()
    rows = []
    with tempfile.TemporaryDirectory() as t:
        for image in images:
            inputs = iproc(images=Image.open(image), return_tensors="pt", return_row_col_info=True)
            pv = inputs["pixel_values"]   # [1, frames, 3, M, M]
            want = proc.replace_image_token({"rows": inputs["rows"], "cols": inputs["cols"]}, 0)
            prompt = IDEFICS3_PROMPT.replace("<image>", want)
            ids = tok(prompt, return_tensors="pt")["input_ids"]
            out, layout = Path(t) / "logits.f32", Path(t) / "layout.txt"
            r = subprocess.run([args.vlm_reference, "--mmproj", str(mmproj), "--model", str(text), "--in", str(image),
                                "--ids", ",".join(map(str, ids[0].tolist())), "--image-token",
                                str(IDEFICS3_IMAGE_TOKEN), "--out", str(out), "--layout-out", str(layout)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"touchstone-vlm-reference failed on {image}: {r.stderr}")
            ours = np.fromfile(out, np.float32).reshape(json.loads(r.stdout)["shape"]).astype(np.float64)
            with torch.no_grad():
                got = model(input_ids=ids, pixel_values=pv).logits[0].double().numpy()
                rotated = model(input_ids=ids, pixel_values=pv.roll(1, dims=1)).logits[0].double().numpy()
            rr = dict(image=image.name, frames=int(pv.shape[1]), positions=int(ids.shape[1]),
                      layout_same=layout.read_text() == want, nmse=nmse(ours, got),
                      max=float(np.abs(ours - got).max()),
                      argmax_same=bool((ours.argmax(-1) == got.argmax(-1)).all()),
                      rotated_nmse=nmse(rotated, got))
            rr["pass"] = rr["layout_same"] and rr["nmse"] <= NMSE_MAX and rr["argmax_same"]
            rows.append(rr)
    return rows


def write_doc(path: Path, rows: list[dict], rows_dec: list[dict], rows3: list[dict], rows3d: list[dict], tf: str,
              pt: str) -> None:
    sys.path.insert(0, str(ROOT / "ci"))
    from validate_families import host_description
    cpu = host_description()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = [BEGIN, "## Vision tower (tiny Gemma 3 vision-language model)", "",
           f"`ci/validate_vision.py` ({datetime.date.today().isoformat()}, {commit}, {cpu}, "
           f"{platform.python_version()}, transformers {tf}, torch {pt}; fp32, eager, 1 thread). "
           "The model is synthetic: a seeded random `Gemma3ForConditionalGeneration` (SigLIP tower of "
           "2 layers, width 32, 2 heads, 64 x 64 images in 8 x 8 patches; Gemma 3's projector pooling the "
           "8 x 8 grid to 16 image tokens of width 64) made by `tools/make-test-models/make-test-models "
           "--vision`, converted by llama.cpp's own `convert_hf_to_gguf.py --mmproj` "
           "(`tests/models/vision/mmproj-gemma3vl-test-f32.gguf`). It validates the formulas and the "
           "mmproj layout, not any released model's weights. Pixels: the reference's preprocessing "
           "against the model's own HF image processor (PIL backend); patches: the SigLIP encoder's "
           "output against `vision_tower(...).last_hidden_state`; embeddings: the projector's against "
           "`get_image_features`. Pass: pixels bit-identical, both NMSE <= 1e-10. The last column is "
           "the NMSE between this image's HF embeddings and the next image's (a wrong image on the "
           "same metric).", "",
           "| image | size | mode | pixels | patches NMSE (max abs) | embeddings NMSE (max abs) | next image | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['image']} | {r['size']} | {r['mode']} | {'identical' if r['pixels_identical'] else 'differ'} "
                   f"| {r['patches_nmse']:.1e} ({r['patches_max']:.1e}) | {r['emb_nmse']:.1e} ({r['emb_max']:.1e}) "
                   f"| {r['control_nmse']:.2f} | {'PASS' if r['pass'] else 'FAIL'} |")
    out += ["", "The decoder with the image (`touchstone-vlm-reference`: the tower, then the reference decoder "
            "with the 16 image tokens inserted after `<start_of_image>` and attended bidirectionally, "
            "`ReferenceTransformer::prefill_embeddings`) against HF's forward on the same ids, pixel values and "
            "`token_type_ids`; every position's logits (prompt `<bos> t t t <start_of_image> [image] "
            "<end_of_image> t t t t t t`, 27 positions; the text test model's 8-token sliding window is "
            "shorter than the image block). The control column: HF with the image attended causally "
            "(no `token_type_ids`) against HF.", "",
            "| image | logits NMSE (max abs) | argmax | causal image | verdict |", "|---|---|---|---|---|"]
    for r in rows_dec:
        out.append(f"| {r['image']} | {r['nmse']:.1e} ({r['max']:.1e}) | {'identical' if r['argmax_same'] else 'differs'} "
                   f"| {r['causal_nmse']:.2f} | {'PASS' if r['pass'] else 'FAIL'} |")
    out += ["", "The tiny `Idefics3ForConditionalGeneration` (SmolVLM's architecture, same tower sizes, the "
            "pixel-shuffle connector by 2: 64 patches to 16 tokens of width 128, projected to 64; "
            "`tests/models/vision/mmproj-idefics3vl-test-f32.gguf`; its processor: longest edge 256, tiles of "
            "64, LANCZOS): every frame (the tiles row by row, then the global view) of the reference's image "
            "splitting against HF's `Idefics3ImageProcessorPil`, and the tower and connector per frame; the "
            "worst frame per image:", "",
            "| image | frames | pixels | patches NMSE | embeddings NMSE | verdict |", "|---|---|---|---|---|---|"]
    for r in rows3:
        out.append(f"| {r['image']} | {r['tiles']} | {'identical' if r['pixels_identical'] else 'differ'} "
                   f"| {r['patches_nmse']:.1e} | {r['emb_nmse']:.1e} | {'PASS' if r['pass'] else 'FAIL'} |")
    out += ["", "The Idefics3 decoder with the image (`tests/models/vision/idefics3vl-test-f32.gguf`: the tiny "
            "model's Llama decoder, extracted as a `LlamaForCausalLM` and converted by the same converter). The "
            "prompt `User:<image>Describe this image.\\nAssistant:` with the processor's text for the image in place "
            "of `<image>` (the reference's, `touchstone/vision/image_prompt.h`, against HF's "
            "`Idefics3Processor.replace_image_token` on HF's rows and columns: the layout column), tokenized by HF; "
            "every position's logits, the reference (`touchstone-vlm-reference --image-token`: each run of `<image>` "
            "one frame's 16 tokens, attended causally) against `Idefics3ForConditionalGeneration` on the same ids and "
            "pixel values. The control column: HF with the frames rotated by one (the global view first) against HF.",
            "", "| image | frames | positions | layout | logits NMSE (max abs) | argmax | frames rotated | verdict |",
            "|---|---|---|---|---|---|---|---|"]
    for r in rows3d:
        out.append(f"| {r['image']} | {r['frames']} | {r['positions']} | "
                   f"{'identical' if r['layout_same'] else 'differs'} | {r['nmse']:.1e} ({r['max']:.1e}) | "
                   f"{'identical' if r['argmax_same'] else 'differs'} | {r['rotated_nmse']:.2e} | "
                   f"{'PASS' if r['pass'] else 'FAIL'} |")
    out.append(END)
    text = path.read_text()
    block = "\n".join(out)
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
