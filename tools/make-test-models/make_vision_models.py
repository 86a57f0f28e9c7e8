#!/usr/bin/env python3
"""Make the vision-language test models, converted by llama.cpp's own
convert_hf_to_gguf.py as llama.cpp's libmtmd reads them:
* a small seeded random Hugging Face Gemma3ForConditionalGeneration (SigLIP vision
  tower + Gemma 3's multimodal projector + a Gemma 3 text decoder): the text GGUF and
  the mmproj GGUF (--mmproj);
* a small seeded random Idefics3ForConditionalGeneration (SmolVLM's architecture: a
  SigLIP-style tower, the pixel-shuffle connector, a Llama decoder): its mmproj GGUF,
  and the text decoder as a GGUF of arch llama. The converter of llama-cpp-python
  0.3.16 converts no Idefics3 text model, so the decoder is extracted as a plain
  LlamaForCausalLM (the same weights, renamed; checked to give the same logits) and
  that is converted, as SmolVLM's released text GGUFs are a Llama conversion. Its
  tokenizer holds Idefics3's image prompt pieces as user-defined tokens:
  <fake_token_around_image> 3, <global-img> 4, <image> 5 (image_token_id),
  <row_R_col_C> 6..21 (R, C in 1..4, row-major).

Run through tools/make-test-models/make-test-models --vision (venv, llama.cpp sources).
Direct use:

    make_vision_models.py --llama-cpp SRC --out DIR [--check-sums FILE] [--write-sums FILE]

Output:
    DIR/hf/gemma3vl/                     the ORIGINAL model (config, safetensors,
                                         preprocessor_config.json, tokenizer.model)
    DIR/gemma3vl-test-f32.gguf           the text decoder (convert_hf_to_gguf.py --outtype f32)
    DIR/mmproj-gemma3vl-test-f32.gguf    the vision tower and projector (--mmproj)
    DIR/hf/idefics3vl/                   the ORIGINAL Idefics3 model (as above)
    DIR/idefics3vl-test-f32.gguf         its text decoder (the extracted LlamaForCausalLM,
                                         --outtype f32; context 512)
    DIR/mmproj-idefics3vl-test-f32.gguf  its vision tower and connector (--mmproj)

The tower: 64 x 64 images in 8 x 8 patches (64 patches), 2 layers of width 32 with 2
heads; the projector pools the 8 x 8 patch grid to 4 x 4 (16 image tokens, kernel 2,
llama.cpp's clip.vision.projector.scale_factor), RMSNorm, then a [32 -> 64] projection.
Deterministic: fixed seeds, single-threaded tokenizer training.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import make_test_models as mt

NAME = "gemma3vl"
SEED = 2001
# The image placeholders of Gemma 3's tokenizer, as user-defined pieces of the test
# tokenizer (ids 3, 4, 5: after unk, bos, eos).
IMAGE_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              image_size=64, patch_size=8, layer_norm_eps=1e-6, num_channels=3)
MM_TOKENS = 16
# Idefics3's image prompt pieces (SmolVLM's tokenizer), user-defined pieces of the
# Idefics3 test tokenizer: ids 3, 4, 5 and the 16 tile pieces 6..21 (row-major).
IDEFICS3_TOKENS = (["<fake_token_around_image>", "<global-img>", "<image>"]
                   + [f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)])
IDEFICS3_CONTEXT = 512   # a 4 x 4-tiled image: 17 frames of 16 tokens + separators


def spm_tokenizer(out: Path, symbols: list[str], tokenizer_class: str, max_length: int,
                  added_tokens: bool = False) -> None:
    """The text test models' SentencePiece BPE (make_test_models.make_spm_tokenizer's
    training), plus user-defined pieces at ids 3, 4, ... (after unk, bos, eos).
    added_tokens: list them in tokenizer_config.json's added_tokens_decoder as not
    special, which is what makes the converter type them USER_DEFINED (it types a
    SentencePiece user-defined piece NORMAL otherwise, CONTROL if special)."""
    import io
    import sentencepiece as spm
    lines = [l for l in mt.corpus_text().splitlines() if l.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=mt.VOCAB,
        byte_fallback=True, character_coverage=1.0, num_threads=1, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, hard_vocab_limit=True, minloglevel=2,
        user_defined_symbols=symbols)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    for i, piece in enumerate(symbols, start=3):
        assert sp.piece_to_id(piece) == i and sp.id_to_piece(i) == piece, (piece, sp.piece_to_id(piece))
    (out / "tokenizer.model").write_bytes(model.getvalue())
    config = {
        "tokenizer_class": tokenizer_class, "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": max_length}
    if added_tokens:
        config["added_tokens_decoder"] = {str(i): {
            "content": piece, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": False} for i, piece in enumerate(symbols, start=3)}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")


def make_tokenizer(out: Path) -> None:
    """The text test models' SentencePiece BPE, plus Gemma 3's three image pieces."""
    spm_tokenizer(out, IMAGE_TOKENS, "GemmaTokenizer", 256)


def make_idefics3(out: Path) -> None:
    """Idefics3: the same tower sizes (64 x 64 tiles in 8 x 8 patches, width 32), pixel
    shuffle by 2 (64 patches -> 16 tokens of width 128), projected to the text width 64;
    a 2-layer Llama decoder with context 512; the tokenizer has Idefics3's image pieces."""
    import torch
    import transformers
    out.mkdir(parents=True, exist_ok=True)
    spm_tokenizer(out, IDEFICS3_TOKENS, "LlamaTokenizer", IDEFICS3_CONTEXT, added_tokens=True)
    torch.manual_seed(SEED + 10)
    text = transformers.LlamaConfig(vocab_size=mt.VOCAB, hidden_size=64, intermediate_size=256,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=IDEFICS3_CONTEXT, rms_norm_eps=1e-5,
                                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    vision = transformers.Idefics3VisionConfig(**{**VISION, "layer_norm_eps": 1e-5})
    config = transformers.Idefics3Config(text_config=text, vision_config=vision, scale_factor=2,
                                         image_token_id=5)
    config.architectures = ["Idefics3ForConditionalGeneration"]
    model = transformers.Idefics3ForConditionalGeneration(config).to(torch.float32).eval()
    g = torch.Generator().manual_seed(SEED + 11)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "vision_model" in name or "connector" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out, safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("transformers_version", None)
    cfg_path.write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    (out / "generation_config.json").unlink(missing_ok=True)
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Idefics3ImageProcessor", "do_resize": True, "resample": 1,
        "size": {"longest_edge": 4 * VISION["image_size"]}, "do_image_splitting": True,
        "max_image_size": {"longest_edge": VISION["image_size"]}, "do_rescale": True,
        "rescale_factor": 0.00392156862745098, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
        "do_pad": True}, indent=1) + "\n")


def add_preproc_image_size(llama_cpp: Path, path: Path, longest_edge: int) -> None:
    """clip.vision.preproc_image_size = the processor's size["longest_edge"], which
    llama.cpp's later converters write for SmolVLM / Idefics3 (conversion/smolvlm.py in
    llama-cpp-python 0.3.36's llama.cpp) and the pinned 0.3.16 converter predates;
    libmtmd 0.3.36 tiles an Idefics3 image as HF's processor does only with it (without
    it, mtmd-image.cpp falls back to llava-uhd slicing: docs/backends/llamacpp.md). The
    file is rewritten with the key appended and everything else as it was."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf
    r = gguf.GGUFReader(str(path))
    tmp = path.with_suffix(".tmp.gguf")
    w = gguf.GGUFWriter(str(tmp), "clip")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            st = f.types[-1]
            vals = [bytes(f.parts[i]).decode() if st == gguf.GGUFValueType.STRING else f.parts[i].tolist()[0]
                    for i in f.data]
            w.add_key_value(k, vals, t, sub_type=st)
        elif t == gguf.GGUFValueType.STRING:
            w.add_key_value(k, bytes(f.parts[f.data[0]]).decode(), t)
        else:
            w.add_key_value(k, f.parts[f.data[0]].tolist()[0], t)
    w.add_uint32("clip.vision.preproc_image_size", longest_edge)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=list(reversed([int(x) for x in t.shape])), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)


def extract_idefics3_text(hf3: Path, dst: Path) -> None:
    """Idefics3's text decoder as a plain LlamaForCausalLM directory: the text_config as
    the config, the checkpoint's model.text_model.* as model.* (lm_head.weight as is),
    the same tokenizer. Checks that its logits equal Idefics3's text-only logits."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((hf3 / "config.json").read_text())["text_config"]
    cfg = mt.legacy_config_keys({**cfg, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                 "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False})
    (dst / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    t = load_file(str(hf3 / "model.safetensors"))
    text = {}
    for k, v in t.items():
        if k.startswith("model.text_model."):
            text["model." + k[len("model.text_model."):]] = v
        elif k == "lm_head.weight":
            text[k] = v
        elif not k.startswith(("model.vision_model.", "model.connector.")):
            raise SystemExit(f"{hf3}: unexpected tensor {k}")
    save_file(text, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for n in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copyfile(hf3 / n, dst / n)
    ids = torch.tensor([[1, 7, 30, 40, 50, 300, 2, 100]])
    with torch.no_grad():
        full = transformers.Idefics3ForConditionalGeneration.from_pretrained(hf3, dtype=torch.float32).eval()
        llama = transformers.LlamaForCausalLM.from_pretrained(dst, dtype=torch.float32).eval()
        want = full(input_ids=ids).logits
        got = llama(input_ids=ids).logits
    diff = (got - want).abs().max().item()
    print(f"  LlamaForCausalLM vs Idefics3 text-only logits: max abs diff {diff:.3g} "
          f"(logits max abs {want.abs().max().item():.3g})")
    if diff > 1e-6:
        raise SystemExit(f"{dst}: extracted LlamaForCausalLM logits differ from Idefics3's by {diff}")


def check_idefics3_text_gguf(llama_cpp: Path, path: Path) -> None:
    """The text GGUF: arch llama, context 512, the image pieces as USER_DEFINED tokens."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf
    r = gguf.GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    ctx = r.fields["llama.context_length"].contents()
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    if arch != "llama" or ctx != IDEFICS3_CONTEXT:
        raise SystemExit(f"{path.name}: architecture {arch!r}, context_length {ctx}")
    for i, piece in enumerate(IDEFICS3_TOKENS, start=3):
        if tokens[i] != piece or types[i] != gguf.TokenType.USER_DEFINED:
            raise SystemExit(f"{path.name}: token {i} is {tokens[i]!r} type {types[i]}, want {piece!r} USER_DEFINED")


def released_layout(path: Path) -> None:
    """The tower's tensors under vision_tower.vision_model.*, as google/gemma-3-*-it's
    checkpoints store them (transformers 4's SiglipVisionModel) and as the converter's
    tensor map expects; transformers 5 writes them without `vision_model.` and reads
    both."""
    from safetensors.torch import load_file, save_file
    t = load_file(str(path))
    renamed = {("vision_tower.vision_model." + k[len("vision_tower."):]
                if k.startswith("vision_tower.") else k): v for k, v in t.items()}
    save_file(renamed, str(path), metadata={"format": "pt"})


def make_hf_model(out: Path) -> None:
    import torch
    import transformers
    out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(out)
    spec = mt.SPECS["gemma3"]
    torch.manual_seed(SEED)
    text = transformers.Gemma3TextConfig(initializer_range=spec["init"], **spec["config"])
    vision = transformers.SiglipVisionConfig(**VISION)
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=MM_TOKENS,
        boi_token_index=3, eoi_token_index=4, image_token_index=5, initializer_range=spec["init"])
    config.architectures = ["Gemma3ForConditionalGeneration"]
    model = transformers.Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            # Every norm weight and bias away from its init (LayerNorm 1 / 0, Gemma 0),
            # the tower's weights at a scale where its activations stay O(1).
            if name.endswith(("norm.weight", "layernorm.weight", "soft_emb_norm.weight")):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "vision_tower" in name or "multi_modal_projector" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            if name.endswith("mm_input_projection_weight"):
                # The converter stores it as F16 (tensor_force_quant, as in the released
                # mmproj files): values that F16 holds exactly keep the GGUF equal to HF.
                p.copy_(p.half().float())
        model.get_output_embeddings().weight.mul_(spec.get("head_scale", 3.0))
    model.save_pretrained(out, safe_serialization=True)
    released_layout(out / "model.safetensors")
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["text_config"] = mt.legacy_config_keys(cfg["text_config"])
    cfg.pop("transformers_version", None)
    cfg_path.write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    (out / "generation_config.json").unlink(missing_ok=True)
    # Gemma3ImageProcessor as google/gemma-3-4b-it configures it, at this tower's size.
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "do_resize": True, "resample": 2,
        "size": {"height": VISION["image_size"], "width": VISION["image_size"]},
        "do_rescale": True, "rescale_factor": 0.00392156862745098, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
        "do_pan_and_scan": False, "image_seq_length": MM_TOKENS}, indent=1) + "\n")


def convert(llama_cpp: Path, hf: Path, out: Path, work: Path, mmproj: bool) -> Path:
    runner = work / "convert_runner.py"
    runner.write_text(mt.CONVERT_RUNNER)
    cmd = [sys.executable, str(runner), str(llama_cpp), "-", str(hf), "--outfile", str(out),
           "--outtype", "f32", "--model-name", out.stem] + (["--mmproj"] if mmproj else [])
    import subprocess
    r = subprocess.run(cmd, capture_output=True, text=True)
    made = out.with_name("mmproj-" + out.name) if mmproj and "mmproj" not in out.name else out
    if r.returncode != 0 or not made.exists():
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
        raise SystemExit(f"convert failed: {' '.join(cmd)}")
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--write-sums", type=Path)
    ap.add_argument("--check-sums", type=Path)
    args = ap.parse_args()
    out = args.out.resolve()
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    hf = out / "hf" / NAME
    shutil.rmtree(hf, ignore_errors=True)
    print(f"== {NAME}", flush=True)
    make_hf_model(hf)
    text = convert(args.llama_cpp, hf, out / f"{NAME}-test-f32.gguf", work, mmproj=False)
    proj = convert(args.llama_cpp, hf, out / f"{NAME}-test-f32.gguf", work, mmproj=True)
    hf3 = out / "hf" / "idefics3vl"
    shutil.rmtree(hf3, ignore_errors=True)
    print("== idefics3vl", flush=True)
    make_idefics3(hf3)
    proj3 = convert(args.llama_cpp, hf3, out / "idefics3vl-test-f32.gguf", work, mmproj=True)
    add_preproc_image_size(args.llama_cpp, proj3, 4 * VISION["image_size"])
    text3_hf = work / "idefics3vl-text"
    extract_idefics3_text(hf3, text3_hf)
    text3 = convert(args.llama_cpp, text3_hf, out / "idefics3vl-test-f32.gguf", work, mmproj=False)
    check_idefics3_text_gguf(args.llama_cpp, text3)
    shutil.rmtree(work, ignore_errors=True)
    sums = {}
    files = [text, proj, text3, proj3] + [d / n for d in (hf, hf3) for n in (
        "model.safetensors", "config.json", "tokenizer.model", "preprocessor_config.json")]
    for p in files:
        sums[str(p.relative_to(out))] = mt.sha256(p)
        print(f"  {p.relative_to(out)}: {p.stat().st_size} bytes {sums[str(p.relative_to(out))][:16]}")
    if args.write_sums:
        args.write_sums.write_text("".join(f"{h}  {n}\n" for n, h in sorted(sums.items())))
    if args.check_sums:
        want = {n.strip(): h for h, n in ((l.split(maxsplit=1)) for l in args.check_sums.read_text().splitlines())}
        bad = [n for n in sums if want.get(n) != sums[n]] + [n for n in want if n not in sums]
        for n in bad:
            print(f"SHA256 MISMATCH {n}: got {sums.get(n)}, {args.check_sums} has {want.get(n)}", file=sys.stderr)
        if bad:
            return 1
        print(f"all {len(sums)} sums match {args.check_sums}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
