#!/usr/bin/env python3
"""Every model family of the scalar reference against Hugging Face transformers, on
models converted by llama.cpp's own converter (tools/make-test-models).

For each family (llama, qwen2, qwen3, gemma3, phi3) the F32 GGUF made by
tools/make-test-models/make-test-models runs through Touchstone's reference, and the
ORIGINAL safetensors (DIR/hf/<family>/, not the GGUF) run through transformers, fp32,
eager attention, CPU, deterministic algorithms, 1 thread:

* `touchstone golden --model F32.gguf --cases CASES --out TMP`: prompt ids, 16 greedy
  ids, first full logits rows, top-K + log-sum-exp for every step, and a teacher-forced
  scoring passage (top-256 logits, lse, target logits per position);
* `touchstone run --json --top-k <n_vocab> -n 16 --no-stop` per prompt: the FULL logits
  row of every step (the vocabulary is 512, so top-512 is everything; printed as the exact
  float32 values), checked to agree with the golden;
* transformers: an independent greedy loop (full forward per step, no cache) from the same
  prompt ids, and the logits along the reference's greedy path.

With --moe, the same for the mixture-of-experts families (mixtral: GGUF arch llama with
llama.expert_count, HF MixtralForCausalLM; qwen3moe: Qwen3MoeForCausalLM; qwen2moe:
Qwen2MoeForCausalLM), made by
`tools/make-test-models/make-test-models --moe`; their section of the doc has its own
markers, so the dense families' section is left as it is. With --gptoss, gpt-oss
(GGUF arch gpt-oss, HF GptOssForCausalLM; tests/models/gpt-oss, made by
`make-test-models --gptoss`: F32, F16, Q8_0 and MXFP4 files), in a section of its own.

Pass: greedy ids identical for every step of every prompt, and per prompt
NMSE = sum((ref - hf)^2) / sum(ref^2) <= 1e-10 over all steps' full rows (float64).
Then every other GGUF of the family (F16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) must load
and run 8 steps through `touchstone run -b reference`; its greedy ids are compared with
the F32 ones for information.

    ci/validate_families.py [--models-dir DIR] [--touchstone BIN] [--family F]... [--moe | --gptoss]
                            [--write-doc docs/validation.md] [--json OUT]

Run it in ~/.cache/touchstone/venv-validate (ci/requirements-validate.txt), or in
~/.cache/touchstone/venv-testmodels which layers on it. Exit 0: all pass; 1: a
family disagrees; 2: setup error.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["llama", "qwen2", "qwen3", "gemma3", "phi3"]
MOE_FAMILIES = ["mixtral", "qwen3moe", "qwen2moe"]   # tests/models/moe; --moe
GPTOSS_FAMILIES = ["gptoss"]             # tests/models/gpt-oss; --gptoss
OTHER_TYPES = ["f16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k"]
FAMILY_TYPES = {"gptoss": ["f16", "q8_0", "mxfp4"]}   # else OTHER_TYPES
STEPS = 16
NMSE_MAX = 1e-10
BEGIN, END = "<!-- validate-families:begin -->", "<!-- validate-families:end -->"
MOE_BEGIN, MOE_END = "<!-- validate-families-moe:begin -->", "<!-- validate-families-moe:end -->"
GPTOSS_BEGIN, GPTOSS_END = "<!-- validate-families-gptoss:begin -->", "<!-- validate-families-gptoss:end -->"

# Text prompts (the reference's tokenizer makes the ids; transformers gets those ids).
# With the 512-token test tokenizers they are 1 to ~45 tokens: every one but the
# shortest crosses Gemma's 8-token and Phi-3's 12-token sliding windows.
PROMPTS = [
    ("one_char", "a"),
    ("short", "Alice was beginning"),
    ("sentence", "So she was considering in her own mind, as well as she could, whether the pleasure"),
    ("long", "There was nothing so very remarkable in that; nor did Alice think it so very much out "
             "of the way to hear the Rabbit say to itself, Oh dear! Oh dear!"),
    ("digits", "In 1865, 42 rabbits ran 3.14 miles: 2718281828 steps."),
    ("unicode", "Ünïcödé café — naïve 東京 ✓ 🦙"),
    ("code", "def area(r):\n    return 3.14159 * r ** 2\n\nprint(area(2))\n"),
]
PASSAGE = ("Alice was beginning to get very tired of sitting by her sister on the bank, and of "
           "having nothing to do: once or twice she had peeped into the book her sister was "
           "reading, but it had no pictures or conversations in it.")


def run(cmd, **kw):
    for attempt in range(30):   # the binary may be mid-relink by a concurrent build
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, **kw)
            break
        except (PermissionError, OSError) as e:
            if attempt == 29 or getattr(e, "errno", None) not in (13, 26):   # EACCES, ETXTBSY
                raise
            time.sleep(2)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r.stdout


def hf_model(path: Path):
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def hf_logits(model, ids):
    import torch
    with torch.no_grad():
        return model(torch.tensor([list(ids)], dtype=torch.long)).logits[0].double().numpy()


def hf_greedy(model, ids, steps):
    import numpy as np
    seq = list(ids)
    out = []
    for _ in range(steps):
        row = hf_logits(model, seq)[-1]
        t = int(np.argmax(row))
        out.append(t)
        seq.append(t)
    return out


def lse(rows):
    import numpy as np
    m = rows.max(-1, keepdims=True)
    return (m[..., 0] + np.log(np.exp(rows - m).sum(-1)))


def strip_keys(src: Path, dst: Path, keys: list[str], dequantize: bool = False,
               add_bool: dict[str, bool] | None = None) -> None:
    """Copy a GGUF without some metadata keys (gguf-py: fields, then tensors as stored, or
    with dequantize=True every tensor dequantized to F32 by gguf-py's numpy code), and
    with the boolean keys of add_bool added."""
    import gguf
    import numpy as np
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in keys:
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub)
    for name, v in (add_bool or {}).items():
        w.add_bool(name, v)
    for t in r.tensors:
        if dequantize:
            w.add_tensor(t.name, np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)   # byte shape for quantized types
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Sensitivity: transformers with one family feature switched off must DISAGREE with the
# reference (NMSE > 1e-3 on the long prompt), so a pass above is not vacuous.
def _cfg(**kw):
    def f(cfg, model):
        for k, v in kw.items():
            setattr(cfg, k, v)
    return f


def _params(pattern, value):
    def f(cfg, model):
        import torch
        with torch.no_grad():
            for n, p in model.named_parameters():
                if re.search(pattern, n):
                    p.fill_(value)
    return f


MUTATIONS = {
    "llama": [("no llama3 RoPE scaling (rope_freqs)", _cfg(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))],
    "qwen2": [("Q/K/V biases zero", _params(r"\.(q|k|v)_proj\.bias$", 0.0)),
              ("RoPE base 1e4 instead of 1e6", _cfg(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))],
    "qwen3": [("QK-norm weights 1", _params(r"\.(q|k)_norm\.weight$", 1.0)),
              ("RoPE base 1e4 instead of 1e6", _cfg(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))],
    "gemma3": [("no sliding window", _cfg(sliding_window=100000)),
               ("every layer global", lambda cfg, model: setattr(cfg, "layer_types", ["full_attention"] * cfg.num_hidden_layers)),
               ("no linear RoPE scaling on the global layer",
                lambda cfg, model: cfg.rope_parameters.update(full_attention={"rope_type": "default", "rope_theta": 1000000.0})),
               ("post-norm weights 0 (x1)", _params(r"post_(attention|feedforward)_layernorm\.weight$", 0.0))],
    # HF MixtralSparseMoeBlock always renormalises, so only k can be switched.
    "mixtral": [("top-1 instead of top-2", _cfg(num_experts_per_tok=1)),
                ("top-3 instead of top-2", _cfg(num_experts_per_tok=3))],
    "qwen3moe": [("norm_topk_prob false (top-2 weights not renormalised)", _cfg(norm_topk_prob=False)),
                 ("top-1 instead of top-2", _cfg(num_experts_per_tok=1)),
                 ("QK-norm weights 1", _params(r"\.(q|k)_norm\.weight$", 1.0))],
    # Qwen2-MoE: the shared expert (its down projection zero) and the router's
    # weighting (renormalised) switched off or on.
    "qwen2moe": [("shared expert off (its down_proj zero)", _params(r"shared_expert\.down_proj\.weight$", 0.0)),
                 ("norm_topk_prob true (top-2 weights renormalised)", _cfg(norm_topk_prob=True)),
                 ("top-1 instead of top-2", _cfg(num_experts_per_tok=1))],
    # gpt-oss: each feature of the family switched off in transformers.
    "gptoss": [("no attention sinks (sinks -inf)", _params(r"\.sinks$", float("-inf"))),
               ("every layer full attention", lambda cfg, model: setattr(cfg, "layer_types", ["full_attention"] * cfg.num_hidden_layers)),
               ("no YaRN (default RoPE, theta 150000)", _cfg(rope_parameters={"rope_type": "default", "rope_theta": 150000.0})),
               ("no SwiGLU clamp (swiglu_limit 1e9)", _cfg(swiglu_limit=1e9)),
               ("router and expert biases zero", _params(r"(router\.bias|_proj_bias)$", 0.0)),
               ("top-1 instead of top-2", _cfg(num_experts_per_tok=1))],
    "phi3": [("no sliding window", _cfg(sliding_window=100000)),
             ("full rotary", lambda cfg, model: (cfg.rope_parameters.update(partial_rotary_factor=1.0),
                                                 setattr(cfg, "partial_rotary_factor", 1.0)))],
}


# Information only (no threshold): what a variant that other implementations compute
# would change. gpt-oss: llama.cpp rounds YaRN's correction range (ggml_rope_yarn_corr_dims:
# floor / ceil), i.e. transformers' truncate = True; the released config says false.
INFO_MUTATIONS = {
    "gptoss": [("YaRN correction range rounded (truncate true, as llama.cpp)",
                lambda cfg, model: cfg.rope_parameters.update(truncate=True))],
}


def sensitivity(fam: str, hf_dir: Path, ids: list[int], greedy: list[int], ref, info: bool = False) -> list[dict]:
    import torch
    import transformers
    out = []
    for name, mutate in (INFO_MUTATIONS.get(fam, []) if info else MUTATIONS[fam]):
        cfg = transformers.AutoConfig.from_pretrained(hf_dir)
        mutate(cfg, None) if "_params" not in mutate.__qualname__ else None
        model = transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, config=cfg, dtype=torch.float32, attn_implementation="eager").eval()
        if "_params" in mutate.__qualname__:
            mutate(cfg, model)
        rows = hf_logits(model, ids + greedy[:-1])[len(ids) - 1:]
        out.append({"feature": name, "nmse": float(((ref - rows) ** 2).sum() / (ref ** 2).sum())})
    return out


# Variants the converter cannot express, checked end to end: a GGUF key written into a
# copy of the converter's F32 file (gguf-py), against transformers with the matching
# config. The same criteria as the main rows (greedy identical, NMSE <= 1e-10), on the
# `long` prompt. Qwen3-MoE with norm_topk_prob = false: llama.cpp's converter writes no
# expert_weights_norm, so only this copy tells the reference not to renormalise.
KEY_VARIANTS = {
    "qwen3moe": [("qwen3moe.expert_weights_norm = false vs norm_topk_prob = False",
                  {"qwen3moe.expert_weights_norm": False}, _cfg(norm_topk_prob=False))],
}


def key_variants(fam: str, gguf_path: Path, hf_dir: Path, touchstone: Path, work: Path, V: int) -> list[dict]:
    import numpy as np
    import torch
    import transformers
    out = []
    for i, (name, keys, mutate) in enumerate(KEY_VARIANTS.get(fam, [])):
        copy = work / f"{fam}-test-f32-variant{i}.gguf"
        strip_keys(gguf_path, copy, [], add_bool=keys)
        js = json.loads(run([touchstone, "run", "-m", copy, "-p", PROMPTS[3][1], "-n", str(STEPS), "--json",
                             "--top-k", str(V), "-b", "reference", "--no-stop", "-t", "1"]))
        ref = np.zeros((len(js["steps"]), V))
        for s_, step in enumerate(js["steps"]):
            for e in step["top_k"]:
                ref[s_, e["id"]] = e["logit"]
        cfg = transformers.AutoConfig.from_pretrained(hf_dir)
        mutate(cfg, None)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, config=cfg, dtype=torch.float32, attn_implementation="eager").eval()
        ids, greedy = js["prompt_ids"], js["generated_ids"]
        rows = hf_logits(model, ids + greedy[:-1])[len(ids) - 1:]
        nmse = float(((ref - rows) ** 2).sum() / (ref ** 2).sum())
        same = hf_greedy(model, ids, STEPS) == greedy
        out.append({"variant": name, "nmse": nmse, "greedy_identical": same,
                    "pass": same and nmse <= NMSE_MAX})
    return out


NOTES = [
    "Notes on the converter (llama.cpp of llama-cpp-python 0.3.16; all families are in it, no newer sdist "
    "was needed) and how tools/make-test-models deals with them:",
    "",
    "- It loads hparams through transformers' `AutoConfig(...).to_dict()`. transformers 5 keeps RoPE settings "
    "only in `rope_parameters`, so the converter finds no `rope_theta` / `rope_scaling`: the GGUF silently gets "
    "no `rope.freq_base` (Qwen's 1e6 becomes llama.cpp's default 1e4) and no llama3 `rope_freqs.weight`, and "
    "Phi-3 fails (`could not find any of: ['rope_theta']`). The converter is run with its own fallback (read "
    "`config.json` as written), and config.json carries the transformers-4 keys beside `rope_parameters` "
    "(transformers reloads it to the same config; checked).",
    "- For llama3 RoPE scaling it reads `original_max_position_embeddings` at the top level of the config "
    "(default 8192) where transformers reads the one inside `rope_scaling`. Real Llama 3.1 has 8192 in "
    "`rope_scaling` only, so the default hides it; the test model (64) sets both. `rope_freqs.weight` is "
    "checked against transformers' llama3 `inv_freq` ratio (with the key only in `rope_scaling` the converter "
    "writes [1, 1, 1, 1, 1, 1, 4.68, 8] where transformers uses [1, 1.29, 7.67, 8, 8, 8, 8, 8]: the check "
    "refuses it, and the reference on such a GGUF disagrees with transformers at NMSE ~0.8, as it should).",
    "- `convert_hf_to_gguf.py` imports `mistral_common` unconditionally; the test tokenizers' pre-tokenizer "
    "hash is not in its table, so `tokenizer.ggml.pre = qwen2` is passed by patching `get_vocab_base_pre` "
    "(SentencePiece vocabularies need no name: `llama` / `default`).",
    "- Phi-3: the converter always writes `phi3.rope.scaling.original_context_length` "
    "(= `original_max_position_embeddings`; 4096 in Phi-3-mini-4k), so every Phi-3 GGUF it makes carries the "
    "key, and the reference refuses it as unknown. llama.cpp reads it only for LongRoPE "
    "(`rope_factors_long/short`, which the reference refuses anyway), so it does not change a model without "
    "those tensors.",
]


MOE_NOTES = [
    "Notes on the mixture-of-experts models (tiny synthetic models of the real architectures, seeded random "
    "weights, NOT real MoE weights: they check that the reference computes what transformers computes for "
    "these architectures, not any released checkpoint):",
    "",
    "- transformers 5 keeps experts fused in memory (`mlp.experts.gate_up_proj`, `down_proj`) but "
    "`save_pretrained` writes the per-expert layout of the released checkpoints "
    "(`block_sparse_moe.experts.N.w1/w2/w3` for Mixtral, `mlp.experts.N.{gate,up,down}_proj` for Qwen3-MoE), "
    "which the converter stacks into the 3-D `ffn_{gate,up,down}_exps`.",
    "- gguf-py of llama.cpp 0.3.16 maps Mixtral's router `block_sparse_moe.gate` to `ffn_gate` (a SmallThinker "
    "entry under FFN_GATE overrides the Mixtral one under FFN_GATE_INP): the file has `blk.N.ffn_gate.weight` "
    "[64, 8] and no `ffn_gate_inp`, a tensor llama.cpp's loader requires (llama-model.cpp creates it without "
    "TENSOR_NOT_REQUIRED) and the reference refuses such a file naming `blk.0.ffn_gate.weight`. "
    "tools/make-test-models drops that entry before converting (llama.cpp 0.3.36's gguf-py calls SmallThinker's "
    "router `primary_router`, so the clash is gone there).",
    "- transformers 5 writes Qwen3-MoE's expert count as `num_local_experts`; the converter's Qwen2MoeModel reads "
    "`num_experts`, so config.json carries both (the same value).",
    "- The converter writes no `qwen3moe.expert_weights_norm` (HF `norm_topk_prob`) and llama.cpp's qwen3moe "
    "graph always renormalises (`build_moe_ffn(..., norm_w = true, ...)`); the reference reads the key when "
    "present, else renormalises as llama.cpp. A Qwen3-MoE with `norm_topk_prob = false` converted by llama.cpp "
    "is therefore computed renormalised by both: the sensitivity row `norm_topk_prob false` shows how far that "
    "is from transformers. The variant row checks the reference's path without renormalisation, on a copy "
    "of the F32 file with `qwen3moe.expert_weights_norm = false` against transformers with "
    "`norm_topk_prob = False`. Released Qwen3-MoE models (30B-A3B, 235B-A22B) have `norm_topk_prob = true`.",
]


GPTOSS_NOTES = [
    "Notes on the gpt-oss model (a tiny synthetic model of the real architecture, seeded random weights, NOT "
    "gpt-oss weights, none of which these machines have: it checks that the reference computes what "
    "transformers computes for GptOssForCausalLM, not any released checkpoint):",
    "",
    "- The HF config has the released models' structure at a tiny size: YaRN (factor 32, beta_fast 32, "
    "beta_slow 1, truncate false, original context 4096, theta 150000), sliding window (8 here, 128 released) "
    "on layer 0 and full attention on layer 1, q/k/v/o biases, one sink logit per head, 8 experts top-2 "
    "(32 or 128 top-4 released), swiglu_alpha 1.702, swiglu_limit 7.0. Expert weights are rounded to MXFP4 "
    "values before saving (the released experts are MXFP4) and the gate/up weights scaled so that gates "
    "pass the clamp.",
    "- The converter (GptOssModel) splits HF's interleaved `gate_up_proj` [E, hidden, 2I] into "
    "`ffn_gate_exps` (columns 0, 2, ...) and `ffn_up_exps` (1, 3, ...), transposed to ggml {hidden, I, E}, and "
    "writes the biases likewise; it emits MXFP4 only from a checkpoint already in MXFP4 (`*_blocks`, "
    "`*_scales`), so the MXFP4 file here is llama-quantize MXFP4_MOE of the F32 file.",
    "- The GGUF carries neither the YaRN betas nor `truncate`, nor the SwiGLU constants: the reference takes "
    "the released config's values (the betas and constants are llama.cpp's as well). llama.cpp always rounds "
    "YaRN's correction range (floor / ceil in `ggml_rope_yarn_corr_dims`), which is transformers' "
    "`truncate = true`: the information row shows how far that is from the released `truncate = false`.",
]


REFUSED_RE = re.compile(r"metadata key '([^']+)' is not supported by the reference")


def validate_family(fam: str, models_dir: Path, touchstone: Path, tmp: Path) -> dict:
    import h5py
    import numpy as np
    gguf = models_dir / f"{fam}-test-f32.gguf"
    hf_dir = models_dir / "hf" / fam
    for p in (gguf, hf_dir / "model.safetensors"):
        if not p.exists():
            raise FileNotFoundError(f"{p} missing: run tools/make-test-models/make-test-models")
    work = tmp / fam
    work.mkdir()
    cases = {"cases": [{"name": n, "prompt": p, "n_predict": STEPS} for n, p in PROMPTS],
             "scoring": [{"name": "passage", "text": PASSAGE}]}
    (work / "cases.json").write_text(json.dumps(cases, indent=1))
    res = {"family": fam, "gguf": gguf.name, "prompts": [], "pass": True, "refused": []}
    # The converter's GGUF as is. If the reference refuses a metadata key, that is a finding
    # (reported, FAIL); the computation is then still checked on a copy without the key(s).
    while True:
        try:
            run([touchstone, "golden", "--model", gguf, "--cases", work / "cases.json", "--out", work / "out",
                 "--name", f"{fam}-test", "--allow-dirty", "-t", "1"])
            break
        except RuntimeError as e:
            m = REFUSED_RE.search(str(e))
            if not m or len(res["refused"]) >= 4:
                raise
            res["refused"].append(m.group(1))
            res["pass"] = False
            print(f"  {fam}: the reference refuses {gguf.name}: key '{m.group(1)}'; "
                  f"checking a copy without {res['refused']}", file=sys.stderr, flush=True)
            stripped = work / f"{fam}-test-f32-stripped.gguf"
            strip_keys(models_dir / f"{fam}-test-f32.gguf", stripped, res["refused"])
            gguf = stripped
    model = hf_model(hf_dir)
    with h5py.File(work / "out" / f"{fam}-test.h5", "r") as f:
        for name, _ in PROMPTS:
            c = f["cases"][name]
            prompt_ids = c["prompt_ids"][()].tolist()
            greedy = c["greedy_ids"][()].tolist()
            V = int(c.attrs["n_vocab"])
            # Full rows for every step from `touchstone run --json --top-k V`.
            js = json.loads(run([touchstone, "run", "-m", gguf, "-p", dict(PROMPTS)[name], "-n", str(STEPS),
                                 "--json", "--top-k", str(V), "-b", "reference", "--no-stop", "-t", "1"]))
            if js["prompt_ids"] != prompt_ids or js["generated_ids"] != greedy:
                raise RuntimeError(f"{fam}/{name}: touchstone run and golden disagree on ids")
            ref = np.zeros((len(js["steps"]), V))
            for s, step in enumerate(js["steps"]):
                for e in step["top_k"]:
                    ref[s, e["id"]] = e["logit"]
            full = c["full_logits"][()].astype(np.float64)
            if not np.array_equal(full, ref[:full.shape[0]]):
                raise RuntimeError(f"{fam}/{name}: golden full_logits != touchstone run --json rows")
            if not np.allclose(c["lse"][()], lse(ref), rtol=0, atol=1e-9):
                raise RuntimeError(f"{fam}/{name}: golden lse != lse of the run --json rows")
            # transformers: own greedy loop, and logits along the reference's path.
            hf_g = hf_greedy(model, prompt_ids, STEPS)
            rows = hf_logits(model, prompt_ids + greedy[:-1])[len(prompt_ids) - 1:]
            d = ref - rows
            nmse_steps = (d ** 2).sum(-1) / (ref ** 2).sum(-1)
            first_diff = next((i for i, (a, b) in enumerate(zip(greedy, hf_g)) if a != b), None)
            margin = np.sort(ref, -1)
            r = {"name": name, "P": len(prompt_ids), "G": len(greedy), "greedy_identical": hf_g == greedy,
                 "first_greedy_diff": first_diff,
                 "nmse": float((d ** 2).sum() / (ref ** 2).sum()), "nmse_worst_step": float(nmse_steps.max()),
                 "worst_step": int(nmse_steps.argmax()), "max_abs": float(np.abs(d).max()),
                 "lse_max_abs": float(np.abs(c["lse"][()] - lse(rows)).max()),
                 "min_top2_margin": float((margin[:, -1] - margin[:, -2]).min()),
                 "ref_logit_std": float(ref.std())}
            if first_diff is not None:
                r["ref_ids"], r["hf_ids"] = greedy, hf_g
            if name == "long":
                res["sensitivity"] = sensitivity(fam, hf_dir, prompt_ids, greedy, ref)
                res["info_variants"] = sensitivity(fam, hf_dir, prompt_ids, greedy, ref, info=True)
                res["pass"] &= all(m["nmse"] > 1e-3 for m in res["sensitivity"])
            r["pass"] = r["greedy_identical"] and r["nmse"] <= NMSE_MAX   # refusals: res["pass"]
            res["pass"] &= r["pass"]
            res["prompts"].append(r)
        s = f["scoring"]["passage"]
        ids = s["token_ids"][()].tolist()
        rows = hf_logits(model, ids)[:-1]
        tk_ids, tk_log = s["topk_ids"][()], s["topk_logits"][()].astype(np.float64)
        hf_tk = np.take_along_axis(rows, tk_ids, 1)
        tgt = rows[np.arange(len(ids) - 1), ids[1:]]
        res["passage"] = {"N": len(ids), "K": int(s.attrs["top_k"]),
                          "topk_max_abs": float(np.abs(hf_tk - tk_log).max()),
                          "topk_nmse": float(((hf_tk - tk_log) ** 2).sum() / (tk_log ** 2).sum()),
                          "top1_agree": float((rows.argmax(-1) == tk_ids[:, 0]).mean()),
                          "lse_max_abs": float(np.abs(lse(rows) - s["lse"][()]).max()),
                          "target_max_abs": float(np.abs(tgt - s["target_logits"][()]).max())}
        res["pass"] &= res["passage"]["top1_agree"] == 1.0 and res["passage"]["topk_nmse"] <= NMSE_MAX
        res["key_variants"] = key_variants(fam, gguf, hf_dir, touchstone, work, V)
        res["pass"] &= all(v["pass"] for v in res["key_variants"])
        res["computation_pass"] = all(p["greedy_identical"] and p["nmse"] <= NMSE_MAX for p in res["prompts"]) \
            and res["passage"]["top1_agree"] == 1.0 and res["passage"]["topk_nmse"] <= NMSE_MAX
    # Every other GGUF of the family loads and runs through the reference (which dequantizes
    # to fp32), and gives the same logits as the reference on a copy of that GGUF that
    # gguf-py dequantized to F32 (an independent dequantizer; the F32 path is the one
    # checked against transformers above).
    def run_rows(p):
        js = json.loads(run([touchstone, "run", "-m", p, "-p", PROMPTS[3][1], "-n", "8", "--json",
                             "--top-k", str(V), "-b", "reference", "--no-stop", "-t", "1"]))
        rows = np.zeros((len(js["steps"]), V))
        for s_, step in enumerate(js["steps"]):
            for e in step["top_k"]:
                rows[s_, e["id"]] = e["logit"]
        return js["generated_ids"], rows

    f32_ids, _ = run_rows(gguf)
    res["quantized"] = []
    for t in FAMILY_TYPES.get(fam, OTHER_TYPES):
        p = models_dir / f"{fam}-test-{t}.gguf"
        if res["refused"]:
            strip_keys(p, work / p.name, res["refused"])
            p = work / p.name
        deq = work / f"{fam}-test-{t}-dequantized-f32.gguf"
        strip_keys(p, deq, [], dequantize=True)
        t0 = time.time()
        q = {"type": t, "size": (models_dir / f"{fam}-test-{t}.gguf").stat().st_size}
        try:
            ids, rows = run_rows(p)
            q["seconds"] = round(time.time() - t0, 2)
            d_ids, d_rows = run_rows(deq)
            q.update(runs=len(ids) == 8, same_as_f32=sum(a == b for a, b in zip(ids, f32_ids)),
                     deq_greedy_identical=ids == d_ids,
                     deq_nmse=float(((rows - d_rows) ** 2).sum() / (d_rows ** 2).sum()),
                     deq_max_abs=float(np.abs(rows - d_rows).max()))
            q["pass"] = q["runs"] and q["deq_greedy_identical"] and q["deq_nmse"] <= NMSE_MAX
        except RuntimeError as e:
            q.update(runs=False, pass_=False, error=str(e)[-500:])
            q["pass"] = False
            print(f"  {p.name}: {e}", file=sys.stderr)
        res["quantized"].append(q)
        res["pass"] &= q["pass"]
    return res


# Per group (the dense families, --moe, --gptoss): its doc section and how it was made.
GROUPS = {
    "dense": dict(begin=BEGIN, end=END, title="## Converted test models", flag="",
                  sums="tests/models/SHA256SUMS", make=""),
    "moe": dict(begin=MOE_BEGIN, end=MOE_END, title="## Mixture-of-experts test models", flag="--moe ",
                sums="tests/models/moe/SHA256SUMS", make="--moe "),
    "gptoss": dict(begin=GPTOSS_BEGIN, end=GPTOSS_END, title="## gpt-oss test models", flag="--gptoss ",
                   sums="tests/models/gpt-oss/SHA256SUMS", make="--gptoss "),
}


def markdown(results: list[dict], meta: dict) -> str:
    group = meta.get("group", "moe" if meta.get("moe") else "dense")
    moe = group != "dense"
    g_ = GROUPS[group]
    types = ", ".join(t.upper() for t in FAMILY_TYPES.get(results[0]["family"], OTHER_TYPES) if t != "f16")
    out = [g_["begin"], g_["title"], "",
           "`tools/make-test-models/make-test-models` makes one small seeded random Hugging Face model",
           "per family and converts it with llama.cpp's own `convert_hf_to_gguf.py` (F32, F16) and",
           f"`llama-quantize` ({types}), both from the llama.cpp vendored",
           "in the llama-cpp-python sdist; `ci/validate_families.py` runs the F32 GGUF through the",
           "reference and the ORIGINAL safetensors through transformers (fp32, eager, CPU, 1 thread).",
           "Criteria: greedy ids identical for 16 steps, NMSE over all 16 full logits rows <= 1e-10.",
           "",
           "```bash",
           f"tools/make-test-models/make-test-models {g_['make']}  # -> ~/.cache/touchstone/test-models, sha256 checked against {g_['sums']}",
           "~/.cache/touchstone/venv-validate/bin/python ci/validate_families.py " + g_["flag"] + "--write-doc docs/validation.md",
           "```",
           "",
           f"- date (UTC): {meta['date']}; host: {meta['host']}; {meta['versions']}",
           f"- converter: {meta['converter']}",
           f"- models: {meta['models']}",
           f"- tokenizers: {meta['tokenizers']}",
           f"- time: {meta['time']}",
           ""]
    refused = [r for r in results if r.get("refused")]
    for r in refused:
        out += [f"**{r['family']}: the reference refuses the converter's GGUF** (metadata key(s) "
                + ", ".join(f"`{k}`" for k in r["refused"]) + "; FAIL). The rows below for it are a copy "
                "without those keys (gguf-py), which checks the computation.", ""]
    out += ["| family | prompts (P tokens) | greedy 16/16 | max NMSE | max abs diff | lse max-abs | min top-2 margin | passage (N) top-K NMSE / max-abs / top-1 | verdict |",
            "|---|---|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        ps = r["prompts"]
        pl = ", ".join(f"{p['name']} ({p['P']})" for p in ps)
        g = sum(p["greedy_identical"] for p in ps)
        s = r["passage"]
        out.append(f"| {r['family']} | {pl} | {g}/{len(ps)} identical | {max(p['nmse'] for p in ps):.3g} | "
                   f"{max(p['max_abs'] for p in ps):.3g} | {max(p['lse_max_abs'] for p in ps):.3g} | "
                   f"{min(p['min_top2_margin'] for p in ps):.3g} | ({s['N']}) {s['topk_nmse']:.3g} / "
                   f"{s['topk_max_abs']:.3g} / {s['top1_agree']:.4f} | {'PASS' if r['pass'] else 'FAIL'} |")
    out += ["", "Sensitivity (transformers with one feature switched off, NMSE against the reference on the "
            "`long` prompt; each must exceed 1e-3, so the agreement above is not vacuous):", ""]
    for r in results:
        out.append(f"- {r['family']}: " + "; ".join(f"{m['feature']}: {m['nmse']:.3g}" for m in r.get("sensitivity", [])))
    info = [(r["family"], m) for r in results for m in r.get("info_variants", [])]
    if info:
        out += ["", "Information only (transformers with a variant another implementation computes; NMSE "
                "against the reference on the `long` prompt, no threshold):", ""]
        for fam, m in info:
            out.append(f"- {fam}: {m['feature']}: {m['nmse']:.3g}")
    variants = [(r["family"], v) for r in results for v in r.get("key_variants", [])]
    if variants:
        out += ["", "Variants the converter cannot write (a key added to a copy of the F32 GGUF by gguf-py, "
                "against transformers with the matching config; `long` prompt, 16 steps, the same criteria):", ""]
        for fam, v in variants:
            out.append(f"- {fam}: {v['variant']}: greedy {'identical' if v['greedy_identical'] else 'DIFFERS'}, "
                       f"NMSE {v['nmse']:.3g} ({'PASS' if v['pass'] else 'FAIL'})")
    out += ["", "Other GGUFs through `touchstone run -b reference -n 8` on the `long` prompt (the reference "
            "dequantizes to fp32). Each cell: runs; NMSE of its full logits against the reference on a copy "
            "of the same GGUF dequantized to F32 by gguf-py (an independent dequantizer; must be <= 1e-10 "
            "with identical greedy ids); greedy ids equal to the F32 model's (of 8, information only). "
            + ("K-quant files hold K blocks only where rows are 256 long ("
               + ("ffn_down_exps, expert width 256" if moe else "ffn_down, n_ff = 256")
               + "); llama-quantize gives the 64-long rows its fallback types (Q5_0/Q5_1/Q8_0)."
               if group != "gptoss" else "")
            + ("gpt-oss: MXFP4 is llama-quantize's MXFP4_MOE (the 3-D expert tensors MXFP4, every other "
               "matrix Q8_0); the test model's experts are MXFP4-exact, so its expert tensors dequantize to the "
               "F32 file's values bit for bit." if group == "gptoss" else ""), "",
            "| family | " + " | ".join(q["type"].upper() for q in results[0]["quantized"]) + " |",
            "|---|" + "---|" * len(results[0]["quantized"])]
    for r in results:
        out.append(f"| {r['family']} | " + " | ".join(
            (f"runs; {q['deq_nmse']:.2g}; {q['same_as_f32']}/8" if q["runs"] else "FAILS") for q in r["quantized"]) + " |")
    fails = [(r["family"], p) for r in results for p in r["prompts"] if not p["pass"]]
    if fails:
        out += ["", "Disagreements:", ""]
        for fam, p in fails:
            out.append(f"- {fam} / {p['name']}: first greedy difference at step {p['first_greedy_diff']}, "
                       f"NMSE {p['nmse']:.3g} (worst step {p['worst_step']}: {p['nmse_worst_step']:.3g}), max abs {p['max_abs']:.3g}")
    out += [""] + meta.get("notes", []) + ["", g_["end"]]
    return "\n".join(out) + "\n"


def write_doc(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    doc = path.read_text(encoding="utf-8")
    if begin in doc and end in doc:
        a = doc.index(begin)
        b = doc.index(end) + len(end)
        doc = doc[:a] + text.rstrip("\n") + doc[b:]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    path.write_text(doc, encoding="utf-8")


def host_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".cache/touchstone/test-models")
    ap.add_argument("--touchstone", type=Path, default=ROOT / "build/dev/bin/touchstone")
    ap.add_argument("--family", action="append", choices=FAMILIES + MOE_FAMILIES + GPTOSS_FAMILIES)
    ap.add_argument("--moe", action="store_true", help="the mixture-of-experts families (tests/models/moe)")
    ap.add_argument("--gptoss", action="store_true", help="gpt-oss (tests/models/gpt-oss)")
    ap.add_argument("--write-doc", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--note", action="append", default=[], help="extra line for the doc section")
    args = ap.parse_args()
    import numpy as np
    import torch
    import transformers
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if not args.touchstone.exists():
        print(f"missing {args.touchstone}", file=sys.stderr)
        return 2
    t0 = time.time()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        group = "gptoss" if args.gptoss else "moe" if args.moe else "dense"
        for fam in args.family or {"gptoss": GPTOSS_FAMILIES, "moe": MOE_FAMILIES, "dense": FAMILIES}[group]:
            t1 = time.time()
            try:
                r = validate_family(fam, args.models_dir, args.touchstone, Path(tmp))
            except (FileNotFoundError, RuntimeError) as e:
                print(f"{fam}: {e}", file=sys.stderr)
                return 2
            r["seconds"] = round(time.time() - t1, 1)
            results.append(r)
            ps = r["prompts"]
            if r["refused"]:
                print(f"{fam:7s} FAIL: the reference refuses the converter's GGUF ({', '.join(r['refused'])}); "
                      f"a copy without the key(s) gives:", flush=True)
            print(f"{fam:7s} {'PASS' if r['pass'] else 'FAIL'}  greedy {sum(p['greedy_identical'] for p in ps)}/{len(ps)}"
                  f"  max NMSE {max(p['nmse'] for p in ps):.3g}  max abs {max(p['max_abs'] for p in ps):.3g}"
                  f"  passage top-K NMSE {r['passage']['topk_nmse']:.3g}"
                  f"  quantized {sum(q['runs'] for q in r['quantized'])}/{len(r['quantized'])} run  ({r['seconds']} s)", flush=True)
            for p in ps:
                if not p["pass"]:
                    print(f"    {p['name']}: P={p['P']} first greedy diff {p['first_greedy_diff']} NMSE {p['nmse']:.3g} "
                          f"worst step {p['worst_step']} ({p['nmse_worst_step']:.3g}) max abs {p['max_abs']:.3g}", flush=True)
    sums = ROOT / GROUPS[group]["sums"]
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), "moe": args.moe,
            "group": group,
            "host": host_description(),
            "versions": f"python {platform.python_version()}, torch {torch.__version__}, transformers "
                        f"{transformers.__version__}, numpy {np.__version__}",
            "converter": "llama.cpp vendored in llama-cpp-python 0.3.16 (sdist): convert_hf_to_gguf.py with its own "
                         "gguf-py, llama-quantize built from the same sources (CPU, 1 thread)",
            "models": f"sha256 of every GGUF in `{sums.relative_to(ROOT)}`",
            "tokenizers": ("gptoss: byte-level BPE (HF tokenizers, Qwen2 regex, 509 + 3 special tokens), "
                           "`tokenizer.ggml.pre = qwen2` given explicitly (the converter's GptOssModel reads a GPT-2 "
                           "style tokenizer.json; not the real o200k_harmony vocabulary)") if args.gptoss else
                          ("mixtral: SentencePiece BPE (byte fallback, 512 pieces) trained on goldens/passages/*.txt; "
                           "qwen3moe, qwen2moe: byte-level BPE (HF tokenizers, Qwen2 regex, 509 + 3 special tokens), "
                           "`tokenizer.ggml.pre = qwen2` given explicitly") if args.moe else
                          "llama, gemma3, phi3: SentencePiece BPE (byte fallback, 512 pieces) trained on "
                          "goldens/passages/*.txt; qwen2, qwen3: byte-level BPE (HF tokenizers, Qwen2 regex, "
                          "509 + 3 special tokens), `tokenizer.ggml.pre = qwen2` given explicitly",
            "time": f"validation {time.time() - t0:.0f} s for {len(results)} families",
            "notes": {"gptoss": GPTOSS_NOTES, "moe": MOE_NOTES, "dense": NOTES}[group] + args.note}
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if args.write_doc:
        write_doc(args.write_doc, markdown(results, meta), GROUPS[group]["begin"], GROUPS[group]["end"])
    ok = all(r["pass"] for r in results)
    print("ALL PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
