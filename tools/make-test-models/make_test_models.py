#!/usr/bin/env python3
"""Make the converted test models: one small seeded random Hugging Face model per
family, converted to GGUF by llama.cpp's own converter and quantized by llama.cpp's
llama-quantize (both from the llama.cpp vendored in the llama-cpp-python sdist).

Run through tools/make-test-models/make-test-models (it sets up the venv, the
llama.cpp sources and llama-quantize, then calls this script). Direct use:

    make_test_models.py --llama-cpp SRC --quantize BIN --out DIR [--family F ...]
                        [--check-sums FILE] [--write-sums FILE]

Output, per family F (llama, qwen2, qwen3, gemma3, phi3; with --family, also the
mixture-of-experts families mixtral, qwen3moe and qwen2moe, tests/models/moe):
    DIR/hf/F/                  config.json, model.safetensors, tokenizer files (the
                               ORIGINAL model that ci/validate_families.py loads in HF)
    DIR/F-test-f32.gguf        convert_hf_to_gguf.py --outtype f32
    DIR/F-test-f16.gguf        convert_hf_to_gguf.py --outtype f16
    DIR/F-test-{q8_0,q4_0,q4_1,q4_k,q5_k,q6_k}.gguf   llama-quantize from the F32 GGUF

Everything is deterministic: fixed seeds, single-threaded tokenizer training,
llama-quantize with 1 thread; SHA256SUMS lists every GGUF (and the safetensors).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PASSAGES = sorted((ROOT / "goldens" / "passages").glob("*.txt"))

FAMILIES = ["llama", "qwen2", "qwen3", "gemma3", "phi3"]
# Mixture-of-experts families: made only when named (--family; make-test-models --moe),
# kept apart in tests/models/moe/ (gpt-oss: tests/models/gpt-oss/) so that
# tests/models/manifest.json is unchanged.
MOE_FAMILIES = ["mixtral", "qwen3moe", "qwen2moe", "gptoss"]
# general.architecture of each family's GGUF (Mixtral is llama + expert_count).
ARCH = {"mixtral": "llama", "gptoss": "gpt-oss"}
QUANTS = ["q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k"]
QUANT_NAME = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q4_k": "Q4_K", "q5_k": "Q5_K", "q6_k": "Q6_K"}
VOCAB = 512

# Qwen2's pre-tokenizer regex (its tokenizer.json), used for the byte-level BPE test tokenizer.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Per family: the HF config (kwargs for the config class), the tokenizer kind, the seed
# and the init scale. All small: 64 hidden, GQA, an FFN width of 256 so that ffn_down's
# rows (n_ff long) are whole 256-blocks and really get K-quants (other rows are 64 long
# and llama-quantize falls back to a 32-block type for them).
SPECS = {
    "llama": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", tokenizer="spm", seed=1001, init=0.12,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                    # Llama 3.1 RoPE scaling, with an original context small enough that the
                    # per-pair divisors (rope_freqs.weight) change low, middle and high pairs.
                    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                         low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=64))),
    "qwen2": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config", tokenizer="bpe", seed=1002, init=0.12,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                    bos_token_id=None, eos_token_id=0,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    "qwen3": dict(
        cls="Qwen3ForCausalLM", cfg="Qwen3Config", tokenizer="bpe", seed=1003, init=0.12,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    use_sliding_window=False, bos_token_id=None, eos_token_id=0,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    "gemma3": dict(
        cls="Gemma3ForCausalLM", cfg="Gemma3TextConfig", tokenizer="spm", seed=1004, init=0.12, head_scale=2.0,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=7,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                    query_pre_attn_scalar=32, sliding_window=8, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                    pad_token_id=0, final_logit_softcapping=None, attn_logit_softcapping=None,
                    # Linear RoPE scaling on the global layers, as Gemma 3 4B/12B/27B (factor 8).
                    rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
                                     "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    "phi3": dict(
        cls="Phi3ForCausalLM", cfg="Phi3Config", tokenizer="spm", seed=1005, init=0.12,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    original_max_position_embeddings=256, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, sliding_window=12, bos_token_id=1, eos_token_id=2,
                    pad_token_id=0, partial_rotary_factor=0.5,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                         partial_rotary_factor=0.5))),
    # Mixtral-style: 8 experts, top-2, renormalised (HF MixtralSparseMoeBlock). Expert
    # width 256 so that ffn_down_exps rows get K-quants, as the dense families' ffn_down.
    # Context 4096 (both MoE families): the serving plans' sessions fit the declared
    # context (ServingPlan::context_needed: quick 265 positions, full 2,355), so the
    # serving checks run within it on every backend (llama.cpp caps a session there).
    # No parameter depends on it (default RoPE): the weights are those of context 256.
    "mixtral": dict(
        cls="MixtralForCausalLM", cfg="MixtralConfig", tokenizer="spm", seed=1006, init=0.12,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                    rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None,
                    num_local_experts=8, num_experts_per_tok=2, bos_token_id=1, eos_token_id=2,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Qwen3-MoE: Qwen3 attention (QK-norm, head_dim 32), 8 experts of width 256, top-2,
    # norm_topk_prob true (as Qwen3-30B-A3B and 235B-A22B); every layer sparse.
    "qwen3moe": dict(
        cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig", tokenizer="bpe", seed=1007, init=0.12,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    use_sliding_window=False, bos_token_id=None, eos_token_id=0,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2 attention (Q/K/V biases, no
    # QK-norm), 8 routed experts of width 256, top-2 NOT renormalised (norm_topk_prob false,
    # as the released models and as llama.cpp computes it), and a shared expert of width
    # 256 gated by sigmoid(shared_expert_gate(h)); every layer sparse.
    "qwen2moe": dict(
        cls="Qwen2MoeForCausalLM", cfg="Qwen2MoeConfig", tokenizer="bpe", seed=1009, init=0.12,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                    rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
                    bos_token_id=None, eos_token_id=0, qkv_bias=True,
                    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
                    shared_expert_intermediate_size=256, norm_topk_prob=False,
                    decoder_sparse_step=1, mlp_only_layers=[],
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # gpt-oss: the released config's structure (YaRN as in gpt-oss-20b/120b: factor 32,
    # beta 32/1, truncate false, original context 4096, theta 150000; alternating sliding /
    # full layers; attention biases; sinks; clamped SwiGLU 1.702 / 7.0; top-k-then-softmax
    # router) at a tiny size. Experts are MXFP4-exact (mxfp4_exact), as the released
    # checkpoints' experts are MXFP4, so the MXFP4 GGUF holds them without loss.
    "gptoss": dict(
        cls="GptOssForCausalLM", cfg="GptOssConfig", tokenizer="bpe", seed=1008, init=0.12,
        expert_scale=4.0, sink_scale=1.5, mxfp4_experts=True,
        config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    sliding_window=8, num_local_experts=8, num_experts_per_tok=2,
                    attention_bias=True, swiglu_alpha=1.702, swiglu_limit=7.0,
                    bos_token_id=None, eos_token_id=0,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                         beta_fast=32.0, beta_slow=1.0, truncate=False,
                                         original_max_position_embeddings=4096))),
}
# Per family, the quantized types made by llama-quantize (default QUANTS).
FAMILY_QUANTS = {"gptoss": ["q8_0", "mxfp4"]}
QUANT_NAME["mxfp4"] = "MXFP4_MOE"   # experts MXFP4, every other matrix Q8_0 (llama-quant.cpp)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def corpus_text() -> str:
    return "".join(p.read_text(encoding="utf-8") for p in PASSAGES)


def make_spm_tokenizer(work: Path, out: Path) -> None:
    """SentencePiece BPE (byte fallback, like Llama 2 / Gemma), trained on the passages."""
    import io
    import sentencepiece as spm
    # From an iterator into memory: the model's trainer_spec then records no file paths,
    # so the bytes do not depend on the output directory.
    lines = [l for l in corpus_text().splitlines() if l.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=VOCAB,
        byte_fallback=True, character_coverage=1.0, num_threads=1, split_digits=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, hard_vocab_limit=True, minloglevel=2)
    (out / "tokenizer.model").write_bytes(model.getvalue())
    # No tokenizer.json: the converter reads tokenizer.model; BOS/EOS ids and add_bos from here.
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 256}, indent=1) + "\n")


def make_bpe_tokenizer(work: Path, out: Path) -> None:
    """Byte-level BPE with Qwen2's pre-tokenizer regex, trained with HF tokenizers."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator([l for l in corpus_text().splitlines() if l.strip()], trainer=trainer)
    tok.add_special_tokens(specials)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
        "bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "model_max_length": 256}, indent=1) + "\n")


def legacy_config_keys(cfg: dict) -> dict:
    """Add the transformers-4 keys that convert_hf_to_gguf.py (llama.cpp of llama-cpp-python
    0.3.16) reads. transformers 5 writes RoPE settings only as `rope_parameters`; without
    `rope_theta` the converter writes no rope.freq_base (llama.cpp then assumes 10 000, wrong
    for Qwen's 1e6) and without `rope_scaling` no llama3 rope_freqs."""
    rp = cfg.get("rope_parameters") or {}
    if "full_attention" in rp:                      # Gemma 3: per layer type
        cfg["rope_theta"] = rp["full_attention"]["rope_theta"]
        cfg["rope_local_base_freq"] = rp["sliding_attention"]["rope_theta"]
        if rp["full_attention"].get("rope_type", "default") != "default":
            cfg["rope_scaling"] = {k: v for k, v in rp["full_attention"].items() if k != "rope_theta"}
    elif rp:
        cfg["rope_theta"] = rp["rope_theta"]
        if rp.get("rope_type", "default") != "default":
            cfg["rope_scaling"] = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        if rp.get("rope_type") == "llama3":
            # The converter computes rope_freqs with the TOP-LEVEL
            # original_max_position_embeddings (default 8192), where HF reads the one
            # inside rope_scaling; Llama 3.1's real config has it only in rope_scaling
            # (8192 = the default). Give the same value in both places.
            cfg["original_max_position_embeddings"] = rp["original_max_position_embeddings"]
    if cfg.get("model_type") == "qwen3_moe" and "num_local_experts" in cfg:
        # transformers 5 writes Qwen3-MoE's expert count as num_local_experts; the
        # converter's Qwen2MoeModel reads num_experts (its base class writes expert_count
        # from num_local_experts too, the same value).
        cfg["num_experts"] = cfg["num_local_experts"]
    return cfg


def mxfp4_exact(w):
    """w with every block of 32 along dim 1 rounded as ggml's quantize_row_mxfp4_ref does
    (e = floor(log2(amax)) - 2 + 127, d = 2^(e - 128), nearest of d * kvalues_mxfp4, first
    on ties), so that MXFP4 holds it exactly. Dim 1 is the GGUF rows' input dim of HF
    gpt-oss's gate_up_proj [E, hidden, 2I] and down_proj [E, I, hidden]."""
    import torch
    kv = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float32)
    e_, k_, n_ = w.shape
    b = w.reshape(e_, k_ // 32, 32, n_)
    amax = b.abs().amax(dim=2, keepdim=True)
    d = torch.where(amax > 0, torch.exp2(torch.floor(torch.log2(amax)) - 3), torch.zeros_like(amax))
    cand = d.unsqueeze(-1) * kv
    best = (cand - b.unsqueeze(-1)).abs().argmin(dim=-1, keepdim=True)
    return torch.gather(cand.expand(*b.shape, 16), -1, best).squeeze(-1).reshape(e_, k_, n_)


def make_hf_model(family: str, out: Path, work: Path) -> None:
    import torch
    import transformers
    spec = SPECS[family]
    out.mkdir(parents=True, exist_ok=True)
    (make_spm_tokenizer if spec["tokenizer"] == "spm" else make_bpe_tokenizer)(work, out)

    torch.manual_seed(spec["seed"])
    config = getattr(transformers, spec["cfg"])(initializer_range=spec["init"], **spec["config"])
    config.architectures = [spec["cls"]]
    model = getattr(transformers, spec["cls"])(config).to(torch.float32).eval()
    # The model's own init sets norm weights to 1 (Gemma: 0, used as 1 + w) and biases to 0;
    # perturb them so that every multiplicative/additive parameter is exercised.
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias") or name.endswith("_bias"):   # gpt-oss: *_proj_bias
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".sinks"):
                p.copy_(spec["sink_scale"] * torch.randn(p.shape, generator=g))
            if "expert_scale" in spec and name.endswith("experts.gate_up_proj"):
                # gpt-oss: gates past swiglu_limit sometimes
                p.mul_(spec["expert_scale"])
            if spec.get("mxfp4_experts") and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(mxfp4_exact(p))
        # With std-0.12 weights the logits have std ~1 over 512 tokens (top-1 probability
        # ~0.03, many near-ties); a 3x LM head (the embedding when tied) gives std ~3.
        # Gemma (tied, embeddings x sqrt(n_embd)) gets 2x: 3x makes top-1 probability ~0.9.
        model.get_output_embeddings().weight.mul_(spec.get("head_scale", 3.0))
    model.save_pretrained(out, safe_serialization=True)
    cfg_path = out / "config.json"
    cfg = legacy_config_keys(json.loads(cfg_path.read_text()))
    cfg.pop("transformers_version", None)
    cfg_path.write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
    (out / "generation_config.json").unlink(missing_ok=True)

    # The config as written must still mean the same model to transformers.
    again = transformers.AutoConfig.from_pretrained(out)
    for key in ("rope_parameters", "layer_types", "sliding_window", "head_dim", "num_key_value_heads",
                "partial_rotary_factor", "tie_word_embeddings", "query_pre_attn_scalar",
                "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "attention_bias",
                "swiglu_alpha", "swiglu_limit", "shared_expert_intermediate_size", "qkv_bias"):
        a, b = getattr(config, key, None), getattr(again, key, None)
        if a != b:
            raise SystemExit(f"{family}: config.json reloads with {key} = {b!r}, built with {a!r}")

    # Logits must not be degenerate (near-uniform or one-hot).
    ids = torch.arange(3, 43).unsqueeze(0) % VOCAB
    with torch.no_grad():
        logits = model(ids).logits[0]
    p = torch.softmax(logits, -1).max(-1).values
    print(f"  {family}: logits std {logits.std().item():.3f}, top-1 prob mean {p.mean().item():.3f} "
          f"(min {p.min().item():.3f}, max {p.max().item():.3f})", flush=True)


CONVERT_RUNNER = textwrap.dedent("""
    # Runs llama.cpp's convert_hf_to_gguf.py with its own gguf-py first on sys.path.
    import json, sys
    src, pre = sys.argv[1], sys.argv[2]
    sys.path.insert(0, src + "/gguf-py")
    sys.path.insert(0, src)
    import gguf
    assert gguf.__file__.startswith(src), gguf.__file__
    import convert_hf_to_gguf as c
    # gguf-py of llama.cpp (llama-cpp-python 0.3.16) lists Mixtral's router name
    # "model.layers.{bid}.block_sparse_moe.gate" under FFN_GATE_INP ("# mixtral phimoe")
    # AND under FFN_GATE ("# smallthinker"); the later entry wins, so Mixtral's router
    # becomes blk.N.ffn_gate.weight (a file llama.cpp itself cannot load: no
    # ffn_gate_inp). The gguf-py of 0.3.36 names smallthinker's router
    # block_sparse_moe.primary_router instead; drop the clash the same way. Dense
    # families have no such tensor, so their conversion is unchanged.
    from gguf.tensor_mapping import TensorNameMap
    _gate = TensorNameMap.block_mappings_cfg[gguf.MODEL_TENSOR.FFN_GATE]
    TensorNameMap.block_mappings_cfg[gguf.MODEL_TENSOR.FFN_GATE] = tuple(
        n for n in _gate if n != "model.layers.{bid}.block_sparse_moe.gate")
    # The converter reads hparams through transformers' AutoConfig(...).to_dict(); with
    # transformers 5 that drops the transformers-4 keys it looks for (rope_theta,
    # rope_scaling), so rope.freq_base and rope_freqs would be silently missing. Read
    # config.json as written instead (the converter's own fallback path).
    def load_hparams(dir_model, is_mistral_format):
        with open(dir_model / "config.json", "r", encoding="utf-8") as f:
            return json.load(f)
    c.ModelBase.load_hparams = staticmethod(load_hparams)
    if pre != "-":
        # A test tokenizer's pre-tokenizer hash is unknown to the converter's table
        # (get_vocab_base_pre raises NotImplementedError); name it explicitly.
        c.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
    c.main()
""")


def convert(llama_cpp: Path, hf_dir: Path, out: Path, outtype: str, pre: str, work: Path) -> None:
    runner = work / "convert_runner.py"
    runner.write_text(CONVERT_RUNNER)
    cmd = [sys.executable, str(runner), str(llama_cpp), pre, str(hf_dir), "--outfile", str(out),
           "--outtype", outtype, "--model-name", out.stem]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-8000:])
        raise SystemExit(f"convert failed: {' '.join(cmd)}")


def check_gguf(family: str, path: Path) -> None:
    """The converted metadata must say what the HF config says (catches a converter that
    silently drops a setting)."""
    import gguf
    spec = SPECS[family]
    cfg = spec["config"]
    r = gguf.GGUFReader(str(path))
    arch = ARCH.get(family, family)
    if r.fields["general.architecture"].contents() != arch:
        raise SystemExit(f"{path.name}: general.architecture {r.fields['general.architecture'].contents()!r}, want {arch!r}")

    def val(key):
        f = r.fields.get(f"{arch}.{key}")
        if f is None:
            return None
        v = f.parts[f.data[0]]
        return v.tolist()[0] if len(v) == 1 else v.tolist()

    rp = cfg["rope_parameters"]
    theta = rp["full_attention"]["rope_theta"] if "full_attention" in rp else rp["rope_theta"]
    want = {"rope.freq_base": theta, "block_count": cfg["num_hidden_layers"],
            "attention.head_count_kv": cfg["num_key_value_heads"],
            "context_length": cfg["max_position_embeddings"]}
    if "head_dim" in cfg:
        want["attention.key_length"] = cfg["head_dim"]
    if family in ("gemma3", "phi3"):
        want["attention.sliding_window"] = cfg["sliding_window"]
    if family == "gemma3" and rp["full_attention"].get("rope_type") == "linear":
        want["rope.scaling.factor"] = rp["full_attention"]["factor"]
    if family in MOE_FAMILIES:
        want["expert_count"] = cfg.get("num_local_experts", cfg.get("num_experts"))
        want["expert_used_count"] = cfg["num_experts_per_tok"]
    if "moe_intermediate_size" in cfg:
        want["expert_feed_forward_length"] = cfg["moe_intermediate_size"]
    if "shared_expert_intermediate_size" in cfg:
        want["expert_shared_feed_forward_length"] = cfg["shared_expert_intermediate_size"]
    if family == "gptoss":
        want["expert_feed_forward_length"] = cfg["intermediate_size"]
        want["attention.sliding_window"] = cfg["sliding_window"]
        want["rope.scaling.factor"] = rp["factor"]
        want["rope.scaling.original_context_length"] = rp["original_max_position_embeddings"]
    if family == "phi3":
        want["rope.dimension_count"] = int(cfg["hidden_size"] * cfg["partial_rotary_factor"]) // cfg["num_attention_heads"]
    for k, v in want.items():
        if val(k) != v:
            raise SystemExit(f"{path.name}: {arch}.{k} = {val(k)!r}, HF config says {v!r}")
    names = {t.name for t in r.tensors}
    if family == "gptoss":
        for part in ("attn_sinks.weight", "attn_output.bias", "ffn_gate_inp.bias", "ffn_gate_exps.bias",
                     "ffn_up_exps.bias", "ffn_down_exps.bias", "post_attention_norm.weight"):
            if f"blk.0.{part}" not in names:
                raise SystemExit(f"{path.name}: no blk.0.{part}")
    if family in MOE_FAMILIES:
        for part in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            if f"blk.0.{part}.weight" not in names:
                raise SystemExit(f"{path.name}: no blk.0.{part}.weight")
    if family == "qwen2moe":
        for part in ("ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                     "attn_q"):
            if f"blk.0.{part}.weight" not in names:
                raise SystemExit(f"{path.name}: no blk.0.{part}.weight")
        if "blk.0.attn_q.bias" not in names:
            raise SystemExit(f"{path.name}: no blk.0.attn_q.bias (qkv_bias)")
    if family == "llama":
        if "rope_freqs.weight" not in names:
            raise SystemExit(f"{path.name}: no rope_freqs.weight for llama3 RoPE scaling")
        # rope_freqs must be HF's per-pair divisor: default inv_freq / llama3 inv_freq.
        import numpy as np
        import transformers
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        hfc = transformers.AutoConfig.from_pretrained(path.parent / "hf" / family)
        inv3, _ = ROPE_INIT_FUNCTIONS["llama3"](hfc, "cpu")
        dim = hfc.head_dim
        inv = 1.0 / (rp["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
        got = next(t for t in r.tensors if t.name == "rope_freqs.weight").data.astype(np.float64)
        want_f = inv / inv3.double().numpy()
        if np.abs(got - want_f).max() > 1e-5 * np.abs(want_f).max():
            raise SystemExit(f"{path.name}: rope_freqs {got.tolist()} != HF's {want_f.tolist()}")
    if ("output.weight" in names) == cfg["tie_word_embeddings"]:
        raise SystemExit(f"{path.name}: output.weight present = {'output.weight' in names}, tied = {cfg['tie_word_embeddings']}")


def quantize(quantize_bin: Path, src: Path, out: Path, qtype: str) -> None:
    cmd = [str(quantize_bin), str(src), str(out), QUANT_NAME[qtype], "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        raise SystemExit(f"quantize failed: {' '.join(cmd)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp source tree (vendored in the llama-cpp-python sdist)")
    ap.add_argument("--quantize", required=True, type=Path, help="llama-quantize binary built from the same sources")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--family", action="append", choices=FAMILIES + MOE_FAMILIES)
    ap.add_argument("--write-sums", type=Path, help="write SHA256SUMS (GGUFs and safetensors) here")
    ap.add_argument("--check-sums", type=Path, help="verify the outputs against this SHA256SUMS")
    args = ap.parse_args()
    families = args.family or FAMILIES
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    sums: dict[str, str] = {}
    for fam in families:
        print(f"== {fam}", flush=True)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        hf = out / "hf" / fam
        shutil.rmtree(hf, ignore_errors=True)
        make_hf_model(fam, hf, work)
        pre = "qwen2" if SPECS[fam]["tokenizer"] == "bpe" else "-"
        f32 = out / f"{fam}-test-f32.gguf"
        convert(args.llama_cpp, hf, f32, "f32", pre, work)
        check_gguf(fam, f32)
        convert(args.llama_cpp, hf, out / f"{fam}-test-f16.gguf", "f16", pre, work)
        quants = FAMILY_QUANTS.get(fam, QUANTS)
        for q in quants:
            quantize(args.quantize, f32, out / f"{fam}-test-{q}.gguf", q)
        for p in [hf / "model.safetensors", hf / "config.json", hf / "tokenizer.model", hf / "tokenizer.json"]:
            if p.exists():
                sums[f"hf/{fam}/{p.name}"] = sha256(p)
        for t in ["f32", "f16"] + quants:
            p = out / f"{fam}-test-{t}.gguf"
            sums[p.name] = sha256(p)
            print(f"  {p.name}: {p.stat().st_size} bytes {sums[p.name][:16]}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    if args.write_sums:
        if args.family and args.write_sums.exists():   # keep the other families' lines
            for line in args.write_sums.read_text().splitlines():
                h, n = line.split(maxsplit=1)
                fam = n.split("/")[1] if n.startswith("hf/") else n.split("-test-")[0]
                if fam not in families:
                    sums[n] = h
        args.write_sums.write_text("".join(f"{h}  {n}\n" for n, h in sorted(sums.items())))
    if args.check_sums:
        want = {}
        for line in args.check_sums.read_text().splitlines():
            h, n = line.split(maxsplit=1)
            want[n.strip()] = h
        bad = [n for n, h in sums.items() if want.get(n) != h]
        missing = [n for n in want if n.split("/")[-1].split("-test-")[0] in families and n not in sums
                   and not n.startswith("hf/") or (n.startswith("hf/") and n.split("/")[1] in families and n not in sums)]
        for n in bad:
            print(f"SHA256 MISMATCH {n}: got {sums[n]}, {args.check_sums} has {want.get(n)}", file=sys.stderr)
        for n in missing:
            print(f"MISSING {n}", file=sys.stderr)
        if bad or missing:
            return 1
        print(f"all {len(sums)} sums match {args.check_sums}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
