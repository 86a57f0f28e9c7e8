#!/usr/bin/env python3
"""Writes tests/models/llama-stress-f32.gguf: tests/models/llama-test-f32.gguf with its
weights rescaled so that range bugs fail parity by design.

* attn_q / attn_k of every layer x QK_SCALE each: q.k/sqrt(d) grows by QK_SCALE^2 and
  reaches a few hundred on the manifest's prompts, so exp(s) overflows fp32 (> 88.7)
  unless the softmax subtracts the max (the `softmax_no_max` fault).
* rope_freqs.weight (llama3 RoPE scaling) dropped: plain RoPE, which every backend
  (vulkan, static_graph included) computes.
* OUTLIER_CHANNELS of token_embd x EMBD_SCALE and the same output channels of layer 0's
  ffn_down x FFN_SCALE: the residual stream carries a few channels ~100x the rest
  ("massive activations"), so sums and norms span a wide range.

The tokenizer and all other metadata are the source's; general.name says stress. A
numpy forward pass (llama, NORM RoPE with rope_freqs, GQA) greedily decodes the
prompts below and prints the max attention score per layer. Deterministic: same
bytes each run (no randomness; gguf-py writes the fields in the source's order).
"""
import argparse, hashlib, os, sys
import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType

QK_SCALE = 10.0              # wq and wk each: scores x100
OUTLIER_CHANNELS = (5, 37)   # residual-stream channels made large
EMBD_SCALE = 100.0
FFN_SCALE = 100.0
# The manifest's prompts as the model's tokenizer gives them (touchstone tokenize -m
# tests/models/llama-test-f32.gguf -p ...), greedily continued N_PREDICT tokens.
PROMPTS = {
    "Once upon a time, in a small village":
        [1, 460, 500, 466, 411, 460, 358, 308, 262, 400, 478, 318, 262, 261, 481, 333, 460, 483, 420, 464, 412],
    "The": [1, 460, 505, 260],
}
N_PREDICT = 16

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))


def scaled_tensors(reader):
    out = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            continue  # plain RoPE: vulkan and static_graph do not compute llama3 scaling
        a = np.array(t.data, dtype=np.float32, copy=True)
        if t.name.endswith(("attn_q.weight", "attn_k.weight")):
            a *= np.float32(QK_SCALE)
        elif t.name == "token_embd.weight":        # (n_vocab, n_embd)
            a[:, list(OUTLIER_CHANNELS)] *= np.float32(EMBD_SCALE)
        elif t.name == "blk.0.ffn_down.weight":    # (n_embd, n_ff): rows = output channels
            a[list(OUTLIER_CHANNELS), :] *= np.float32(FFN_SCALE)
        out[t.name] = a
    return out


def field(reader, key):
    return reader.fields[key].contents()


def forward_max_scores(reader, w, tokens, n_predict):
    """Greedy decode; returns (per-layer max score, generated ids, max |residual|)."""
    n_layer = field(reader, "llama.block_count")
    n_head = field(reader, "llama.attention.head_count")
    n_kv = field(reader, "llama.attention.head_count_kv")
    n_embd = field(reader, "llama.embedding_length")
    hd = n_embd // n_head
    eps = field(reader, "llama.attention.layer_norm_rms_epsilon")
    base = field(reader, "llama.rope.freq_base")
    ff = w["rope_freqs.weight"].astype(np.float64) if "rope_freqs.weight" in w else 1.0
    inv = base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd) / ff
    W = {k: v.astype(np.float64) for k, v in w.items()}

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def rope(x, pos):  # x (T, H, hd), NORM mode: adjacent pairs
        ang = np.outer(pos, inv)[:, None, :]
        c, s = np.cos(ang), np.sin(ang)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2] = x0 * c - x1 * s
        y[..., 1::2] = x0 * s + x1 * c
        return y

    ids = list(tokens)
    maxs = np.full(n_layer, -np.inf)
    max_res = 0.0
    gen = []
    for _ in range(n_predict):  # full recompute each step: tiny model
        T = len(ids)
        x = W["token_embd.weight"][ids]
        pos = np.arange(T)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for l in range(n_layer):
            p = f"blk.{l}."
            h = rms(x, W[p + "attn_norm.weight"])
            q = rope((h @ W[p + "attn_q.weight"].T).reshape(T, n_head, hd), pos)
            k = rope((h @ W[p + "attn_k.weight"].T).reshape(T, n_kv, hd), pos)
            v = (h @ W[p + "attn_v.weight"].T).reshape(T, n_kv, hd)
            o = np.empty((T, n_head, hd))
            for hh in range(n_head):
                kv = hh // (n_head // n_kv)
                s = q[:, hh] @ k[:, kv].T / np.sqrt(hd)
                maxs[l] = max(maxs[l], s[np.tril_indices(T)].max())
                s = s + mask
                e = np.exp(s - s.max(axis=1, keepdims=True))
                o[:, hh] = (e / e.sum(axis=1, keepdims=True)) @ v[:, kv]
            x = x + o.reshape(T, n_embd) @ W[p + "attn_output.weight"].T
            h = rms(x, W[p + "ffn_norm.weight"])
            g = h @ W[p + "ffn_gate.weight"].T
            u = h @ W[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down.weight"].T
            max_res = max(max_res, np.abs(x).max())
        logits = rms(x[-1], W["output_norm.weight"]) @ W["output.weight"].T
        nxt = int(np.argmax(logits))
        gen.append(nxt)
        ids.append(nxt)
    return maxs, gen, max_res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=os.path.join(root, "tests/models/llama-test-f32.gguf"))
    ap.add_argument("--out", default=os.path.join(root, "tests/models"))
    ap.add_argument("--check", action="store_true",
                    help="write to a temp dir and compare with tests/models/SHA256SUMS")
    args = ap.parse_args()
    reader = GGUFReader(args.src)
    w = scaled_tensors(reader)

    src_w = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}
    for label, ww in (("source", src_w), ("stress", w)):
        for prompt, toks in PROMPTS.items():
            maxs, gen, res = forward_max_scores(reader, ww, toks, N_PREDICT)
            print(f"[{label}] {prompt!r}: max attention score per layer "
                  f"{', '.join(f'{m:.1f}' for m in maxs)} (max {maxs.max():.1f}); "
                  f"max |residual| {res:.1f}; greedy {gen}")

    name = "llama-stress-f32"
    out_dir = args.out
    if args.check:
        import tempfile
        out_dir = tempfile.mkdtemp()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name + ".gguf")
    arch = field(reader, "general.architecture")
    writer = GGUFWriter(path, arch)
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == GGUFValueType.ARRAY else None
        val = name if f.name == "general.name" else f.contents()
        writer.add_key_value(f.name, val, vt, sub_type=sub)
    for t in reader.tensors:
        if t.name in w:
            writer.add_tensor(t.name, w[t.name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    print(f"wrote {path} sha256 {sha}")
    if args.check:
        want = None
        with open(os.path.join(root, "tests/models/SHA256SUMS")) as fh:
            for line in fh:
                s, n = line.split()
                if n == name + ".gguf":
                    want = s
        print("matches SHA256SUMS" if sha == want else f"MISMATCH (SHA256SUMS: {want})")
        return 0 if sha == want else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
