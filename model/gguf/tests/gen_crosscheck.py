#!/usr/bin/env python3
"""Generates tests/data/quant_crosscheck.txt: expected dequantized values from
the reference Python implementation (`gguf.quants.dequantize`, gguf-py).

For every supported type, two blocks of seeded random bytes are produced; the
fp16 scale fields are overwritten with random finite values so that outputs
are finite. Output format (all numbers hex, floats as IEEE-754 bit patterns):

    type <NAME> <ggml type number> <n_elements>
    bytes <hex of the raw blocks>
    values <8-hex-digit float32 bits> ...

If a model path is given (SmolLM2-135M-Instruct.Q4_1.gguf), the first 64
values of a few of its tensors are appended as

    model <tensor name> <n_values>
    values ...

Usage: python3 gen_crosscheck.py [model.gguf] > data/quant_crosscheck.txt
"""
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of the fp16 scale fields inside one block (ggml-common.h).
HALF_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def random_blocks(rng, qtype, n_blocks):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F16:
        return rng.uniform(-4, 4, n_blocks).astype(np.float16).view(np.uint8)
    if qtype == T.BF16:
        f = rng.uniform(-4, 4, n_blocks).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for b in range(n_blocks):
        for off in HALF_FIELDS[qtype]:
            h = np.array([rng.uniform(-0.1, 0.1)], dtype=np.float16).view(np.uint8)
            raw[b, off:off + 2] = h
    return raw.reshape(-1)


def emit_values(vals):
    bits = np.ascontiguousarray(vals, dtype=np.float32).view(np.uint32)
    print("values " + " ".join(f"{int(v):08x}" for v in bits))


def main():
    rng = np.random.default_rng(20240601)
    for qtype in [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                  T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        n_blocks = 2 if block_size > 1 else 64
        raw = random_blocks(rng, qtype, n_blocks)
        vals = dequantize(raw.reshape(1, -1), qtype).reshape(-1)
        print(f"type {qtype.name} {int(qtype)} {vals.size}")
        print("bytes " + raw.tobytes().hex())
        emit_values(vals)
    if len(sys.argv) > 1:
        reader = GGUFReader(sys.argv[1])
        wanted = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_norm.weight"]
        for t in reader.tensors:
            if t.name in wanted:
                vals = dequantize(t.data, t.tensor_type).reshape(-1)[:64]
                print(f"model {t.name} {vals.size}")
                emit_values(vals)


if __name__ == "__main__":
    main()
