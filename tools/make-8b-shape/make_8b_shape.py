#!/usr/bin/env python3
"""Writes a GGUF with Llama-3.1-8B's shape and seeded random Q4_K_M-style weights.

Shape (Meta-Llama-3.1-8B config.json): 32 layers, n_embd 4096, 32 query heads and 8 KV
heads of 128 (GQA), n_ff 14336, vocabulary 128256, RoPE base 500000, RMSNorm eps 1e-5,
context 131072; untied output matrix. Types as llama.cpp's Q4_K_M mix
(src/llama-quant.cpp, llama_tensor_get_type): Q6_K for output.weight, and for attn_v and
ffn_down of the layers use_more_bits() names; Q4_K for every other matrix, token_embd
included; the norms F32. (The llama3 RoPE frequency factors are left out: the plain
"llama" family, which every in-tree backend computes.)

Weights: every block is random but well-formed, zero-centred and of the size trained
weights have (|w| ~ 0.03), so activations stay finite through 32 layers:
* Q4_K: d = 1.2e-4, dmin = 7.5 d, each sub-block's 6-bit scale s in [1, 63] random and
  its min m = s, 4-bit quants random: w = d s q - dmin m = d s (q - 7.5).
* Q6_K: d = 1e-4, int8 scales random in [-8, 8], 6-bit quants random: w = d sc (q - 32).
The tokenizer is SmolLM2's (byte-level BPE, 49152 tokens and its merges and chat
template), padded with control tokens <|reserved_N|> to 128256 so that the embedding
and output matrices have the real vocabulary's size. Deterministic for a seed.
"""
import argparse, os, sys
import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType, GGMLQuantizationType as QT

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 4096, 14336, 32, 8, 128
N_VOCAB, N_CTX, ROPE_BASE, EPS = 128256, 131072, 500000.0, 1e-5
QK_K = 256


def use_more_bits(i, n):  # llama-quant.cpp
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_blocks(rng, n_blocks):
    b = np.empty((n_blocks, 144), dtype=np.uint8)
    d = np.float16(1.2e-4)
    b[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    b[:, 2:4] = np.frombuffer(np.float16(7.5 * float(d)).tobytes(), dtype=np.uint8)
    s = rng.integers(1, 64, size=(n_blocks, 8), dtype=np.uint8)  # scale = min, 6 bits
    lo, hi = s[:, :4], s[:, 4:]
    top = (hi >> 4) << 6
    b[:, 4:8] = lo | top          # scales[0..3]: sc_0..3, top bits of sc_4..7
    b[:, 8:12] = lo | top         # scales[4..7]: m_0..3,  top bits of m_4..7
    b[:, 12:16] = (hi & 0xF) | ((hi & 0xF) << 4)  # scales[8..11]: low bits of sc/m 4..7
    b[:, 16:144] = rng.integers(0, 256, size=(n_blocks, 128), dtype=np.uint8)
    return b


def q6_k_blocks(rng, n_blocks):
    b = np.empty((n_blocks, 210), dtype=np.uint8)
    b[:, 0:192] = rng.integers(0, 256, size=(n_blocks, 192), dtype=np.uint8)  # ql, qh
    b[:, 192:208] = rng.integers(-8, 9, size=(n_blocks, 16), dtype=np.int8).view(np.uint8)
    b[:, 208:210] = np.frombuffer(np.float16(1e-4).tobytes(), dtype=np.uint8)
    return b


def matrices(n_layer):
    """(name, n_out, n_in, type) of every matrix, in llama.cpp's tensor order."""
    out = [("token_embd.weight", N_VOCAB, N_EMBD, QT.Q4_K)]
    for i in range(n_layer):
        v_type = QT.Q6_K if use_more_bits(i, n_layer) else QT.Q4_K
        out += [(f"blk.{i}.attn_q.weight", N_HEAD * HEAD_DIM, N_EMBD, QT.Q4_K),
                (f"blk.{i}.attn_k.weight", N_HEAD_KV * HEAD_DIM, N_EMBD, QT.Q4_K),
                (f"blk.{i}.attn_v.weight", N_HEAD_KV * HEAD_DIM, N_EMBD, v_type),
                (f"blk.{i}.attn_output.weight", N_EMBD, N_HEAD * HEAD_DIM, QT.Q4_K),
                (f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD, QT.Q4_K),
                (f"blk.{i}.ffn_up.weight", N_FF, N_EMBD, QT.Q4_K),
                (f"blk.{i}.ffn_down.weight", N_EMBD, N_FF, v_type)]
    out.append(("output.weight", N_VOCAB, N_EMBD, QT.Q6_K))
    return out


def add_metadata(w, tok, n_layer):
    w.add_name("llama-3.1-8b-shape random Q4_K_M")
    w.add_uint32("general.file_type", 15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add_uint32("general.quantization_version", 2)
    w.add_block_count(n_layer)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(N_VOCAB)
    f = tok.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0])
             for i in f["tokenizer.ggml.token_type"].data]
    n_real = len(tokens)
    tokens += [f"<|reserved_{i}|>" for i in range(N_VOCAB - n_real)]
    types += [3] * (N_VOCAB - n_real)  # CONTROL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(f["tokenizer.ggml.pre"].contents())
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        w.add_uint32("tokenizer.ggml." + key, f["tokenizer.ggml." + key].contents())
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_chat_template(f["tokenizer.chat_template"].contents())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.expanduser(
        "~/.cache/touchstone/models/llama-8b-shape-q4_k_m.gguf"))
    ap.add_argument("--tokenizer", default=os.path.expanduser(
        "~/.cache/touchstone/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        help="GGUF whose tokenizer is copied (ci/bootstrap caches SmolLM2 there)")
    ap.add_argument("--layers", type=int, default=32, help="32 for the real shape")
    ap.add_argument("--seed", type=int, default=8)
    a = ap.parse_args()
    if not os.path.exists(a.tokenizer):
        print(f"make-8b-shape: {a.tokenizer}: no such file (run ci/bootstrap)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(a.seed)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    w = GGUFWriter(tmp, "llama")
    add_metadata(w, GGUFReader(a.tokenizer), a.layers)
    mats = matrices(a.layers)
    sizes = {QT.Q4_K: 144, QT.Q6_K: 210}
    for name, n_out, n_in, t in mats:
        nbytes = n_out * n_in // QK_K * sizes[t]
        w.add_tensor_info(name, [n_out, n_in * sizes[t] // QK_K], np.dtype(np.uint8), nbytes,
                          raw_dtype=t)
    norms = ["output_norm.weight"] + [f"blk.{i}.{n}_norm.weight" for i in range(a.layers)
                                      for n in ("attn", "ffn")]
    for name in norms:
        w.add_tensor_info(name, [N_EMBD], np.dtype(np.float32), 4 * N_EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, n_out, n_in, t in mats:
        n_blocks = n_out * n_in // QK_K
        blocks = q4_k_blocks(rng, n_blocks) if t == QT.Q4_K else q6_k_blocks(rng, n_blocks)
        w.write_tensor_data(blocks.reshape(n_out, -1))
    for name in norms:
        w.write_tensor_data(np.ones(N_EMBD, dtype=np.float32))
    w.close()
    os.replace(tmp, a.out)
    print(f"wrote {a.out}: {os.path.getsize(a.out) / 1e9:.2f} GB, {a.layers} layers, "
          f"{len(mats) + len(norms)} tensors, seed {a.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
