"""numpy_llama: the Llama and Gemma 3 forward pass in NumPy, served to the Touchstone harness.

    touchstone parity --backend "exec:python3 -m touchstone_engine.examples.numpy_llama" \\
        --weights full_precision --manifest goldens/manifest.json

Reads the GGUF itself (gguf_reader.py), dequantizes every weight to float32 at
load, and computes the way the scalar reference does
(reference/transformer/src/reference_forward.cpp), in whole-sequence NumPy form. The
model is data: Config reads the family's switches from the metadata (as
model/core/src/model_config.cpp does) and the one pass below follows them.

    x   = token_embd[token] * embd_scale                 (Gemma 3: fp32(sqrt(n_embd)); else 1)
    per layer l (its RoPE base and scale, its sliding window):
                h = RMSNorm(x) * attn_norm
                q, k, v = Wq h, Wk h, Wv h
                q_h = RMSNorm(q_h) * attn_q_norm, k_h likewise, per head   (QK-norm: Gemma 3)
                RoPE(q), RoPE(k), theta = pos / scale * base^(-2i/n_rot):
                  llama:  interleaved pairs (2i, 2i+1); llama.cpp's converter permuted
                          the Q/K rows so that this equals HF's rotate_half;
                  gemma3: NeoX pairs (i, i + n_rot/2), HF's rotate_half as is.
                attention per query head h over KV head h // (n_head / n_head_kv) (GQA),
                  causal (and the last W positions with a window W), scale attn_scale,
                  softmax with the max subtracted
                a = Wo attn;  a = RMSNorm(a) * post_attention_norm   (post-norms: Gemma 3)
                x += a;  h = RMSNorm(x) * ffn_norm
                f = Wdown(act(Wgate h) * Wup h)   act = SiLU (llama), tanh-GELU (gemma3)
                f = RMSNorm(f) * post_ffw_norm                       (post-norms: Gemma 3)
                x += f
    logits = W_out (RMSNorm(x) * output_norm)        (W_out = token_embd when tied)
    logits = cap * tanh(logits / cap)                 (when final_logit_softcapping is set)

Gemma 3: layers l % 6 == 5 are global (rope.freq_base, linear scaling if set, no
window); the others attend to the last attention.sliding_window positions with
rope.freq_base_swa (10000 when absent), unscaled. Attention scale 1/sqrt(head_dim)
(1/sqrt(n_embd / n_head) for the 62-layer 27B). Gemma's "1 + weight" RMSNorm is
already folded into the GGUF norm weights by llama.cpp's converter: used as stored.

Numerics: activations are stored as float32 and rounded where the reference
rounds them (after every matrix product, norm, RoPE, activation, attention and
residual add, the embedding scale and the soft-cap); norms, RoPE, softmax,
SiLU, GELU and tanh are evaluated in float64. Matrix products (and attention's
QK and PV products) run in TOUCHSTONE_NUMPY_MATMUL:
  float32 (default)  OpenBLAS sgemm/sgemv on float32 weights: within the exact
                     profile on the whole SmolLM2 and Gemma 3 270M suites;
  float64            weights kept as float64 copies (twice the memory), dgemm:
                     the reference's accumulation precision.
docs/python-engines.md has the numbers of both.
Threads: OpenBLAS's own (OPENBLAS_NUM_THREADS); the session's n_threads is not used.
"""

import math
import os
from collections import namedtuple

import numpy as np

from touchstone_engine import (TS_CAP_ALL_POSITION_LOGITS, TS_CAP_BATCHED_SESSIONS,
                               TS_ERR_INVALID_ARGUMENT, TS_ERR_IO,
                               TS_ERR_UNSUPPORTED, Capabilities, Engine, EngineError, Session,
                               serve, weight_type_bit)
from touchstone_engine.examples.gguf_reader import GGUFError, GGUFFile

F32, F64 = np.float32, np.float64
QUERY_BLOCK = 256  # queries per attention block (bounds the score matrix)

# "{arch}.*" keys this engine reads or that cannot change what it computes, per
# family (as model/core/src/model_config.cpp known_keys); any other key
# changes the model and is refused by name (as the reference does).
COMMON_KEYS = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "rope.freq_base", "rope.dimension_count",
    "attention.layer_norm_rms_epsilon", "vocab_size", "attention.key_length",
    "attention.value_length", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.original_context_length", "attention.sliding_window"}
FAMILY_KEYS = {"llama": COMMON_KEYS,
               "gemma3": COMMON_KEYS | {"rope.freq_base_swa", "final_logit_softcapping"}}

# One layer's attention: RoPE base and linear scale, sliding window (0 = none).
LayerConfig = namedtuple("LayerConfig", "rope_base rope_scale window")


def _unsupported(msg):
    return EngineError(TS_ERR_UNSUPPORTED, msg)


class Config:
    """The model as data: shapes, per-layer attention and the family's switches."""

    def __init__(self, g):
        md = g.metadata
        self.arch = arch = md.get("general.architecture")
        if arch not in FAMILY_KEYS:
            raise _unsupported(f"{g.path}: architecture '{arch}' is not computed by numpy_llama "
                               f"(supported: {', '.join(FAMILY_KEYS)})")
        prefix = arch + "."
        for key in md:
            if key.startswith(prefix) and key[len(prefix):] not in FAMILY_KEYS[arch]:
                raise _unsupported(f"{g.path}: metadata key '{key}' is not supported by "
                                   f"numpy_llama for architecture '{arch}' (computing without "
                                   "it would be silently wrong)")

        def get(k, default=None):
            v = md.get(prefix + k, default)
            if v is None:
                raise EngineError(TS_ERR_IO, f"{g.path}: metadata key '{prefix}{k}' is missing")
            return v

        self._read_shapes(g, md, get)
        self._read_family(g, get)

    def _read_shapes(self, g, md, get):
        self.n_layer, self.n_embd = int(get("block_count")), int(get("embedding_length"))
        self.n_ff, self.n_head = int(get("feed_forward_length")), int(get("attention.head_count"))
        self.n_head_kv = int(get("attention.head_count_kv", self.n_head))
        self.n_ctx = int(get("context_length"))
        self.head_dim = int(get("attention.key_length", 0)) or self.n_embd // self.n_head
        if int(get("attention.value_length", self.head_dim)) != self.head_dim:
            raise _unsupported(f"{g.path}: attention.value_length != key_length")
        self.n_rot = int(get("rope.dimension_count", self.head_dim))
        if self.n_rot != self.head_dim:
            raise _unsupported(f"{g.path}: partial rotary (rope.dimension_count {self.n_rot} != "
                               f"head dim {self.head_dim}) is not supported")
        self.rope_base = float(F32(get("rope.freq_base", 10000.0)))
        self.eps = float(F32(get("attention.layer_norm_rms_epsilon")))
        tokens = md.get("tokenizer.ggml.tokens")
        self.n_vocab = int(get("vocab_size", len(tokens) if tokens else 0))
        if min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_vocab) <= 0 or \
                self.n_head % self.n_head_kv:
            raise EngineError(TS_ERR_IO, f"{g.path}: inconsistent model shape")

    def _read_family(self, g, get):
        """The family's switches (defaults: a plain Llama) and each layer's attention."""
        scale, window = self._rope_scale(g, get), int(get("attention.sliding_window", 0))
        self.neox_rope = self.qk_norm = self.post_norms = self.gelu = False
        self.embd_scale, self.softcap = 1.0, 0.0
        self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        self.layers = [LayerConfig(self.rope_base, scale, window)] * self.n_layer
        if self.arch == "gemma3":
            self._gemma3(g, get, scale, window)

    def _gemma3(self, g, get, scale, window):
        """HF Gemma3TextModel / llama.cpp llm_build_gemma3_iswa, as the reference reads it."""
        self.neox_rope = self.qk_norm = self.post_norms = self.gelu = True
        self.embd_scale = float(F32(math.sqrt(self.n_embd)))  # HF's fp32 embed_scale buffer
        # query_pre_attn_scalar is not in GGUF: head_dim, but n_embd / n_head for the
        # 62-layer 27B (as llama.cpp).
        qpas = self.n_embd / self.n_head if self.n_layer == 62 else self.head_dim
        self.attn_scale = 1.0 / math.sqrt(qpas)
        self.softcap = float(get("final_logit_softcapping", 0.0))
        if window <= 0:
            raise EngineError(TS_ERR_IO, f"{g.path}: gemma3.attention.sliding_window is required")
        local = LayerConfig(float(get("rope.freq_base_swa", 10000.0)), 1.0, window)
        glob = LayerConfig(self.rope_base, scale, 0)
        self.layers = [glob if li % 6 == 5 else local for li in range(self.n_layer)]

    @staticmethod
    def _rope_scale(g, get):
        kind = get("rope.scaling.type", "none")
        factor = float(get("rope.scaling.factor", 0.0) or 0.0)
        if kind == "none":
            if factor not in (0.0, 1.0):
                raise _unsupported(f"{g.path}: rope.scaling.factor {factor} without a type")
            return 1.0
        if kind != "linear" or not factor >= 1.0:
            raise _unsupported(f"{g.path}: rope.scaling.type '{kind}' (factor {factor}) is not "
                               "supported (only 'none' and 'linear')")
        return factor

    def layer_shapes(self):
        """Each layer's tensors (name -> shape) for this family."""
        d, hd = self.n_embd, self.head_dim
        q_dim, kv_dim = self.n_head * hd, self.n_head_kv * hd
        s = {"attn_norm": (d,), "attn_q": (q_dim, d), "attn_k": (kv_dim, d),
             "attn_v": (kv_dim, d), "attn_output": (d, q_dim), "ffn_norm": (d,),
             "ffn_gate": (self.n_ff, d), "ffn_up": (self.n_ff, d), "ffn_down": (d, self.n_ff)}
        if self.qk_norm:
            s.update(attn_q_norm=(hd,), attn_k_norm=(hd,))
        if self.post_norms:
            s.update(post_attention_norm=(d,), post_ffw_norm=(d,))
        return s

    def expected_tensors(self):
        """Every tensor name the pass may read (output.weight: untied; rope_freqs: llama)."""
        names = {"token_embd.weight", "output_norm.weight", "output.weight"}
        if self.arch == "llama":
            names.add("rope_freqs.weight")
        for i in range(self.n_layer):
            names.update(f"blk.{i}.{k}.weight" for k in self.layer_shapes())
        return names


class Model:
    """Weights as float32 (and float64 copies of the matrices when matmuls are float64)."""

    def __init__(self, path, matmul_dtype):
        try:
            g = GGUFFile(path)
        except FileNotFoundError as e:
            raise EngineError(TS_ERR_IO, f"{path}: {e.strerror}") from None
        except (OSError, GGUFError) as e:
            raise EngineError(TS_ERR_IO, str(e)) from None
        self.c = c = Config(g)
        self.n_vocab = c.n_vocab
        # For grammars (llguidance_grammar.py): the vocabulary, and its LLTokenizer once built.
        self.tokenizer_md = {k: v for k, v in g.metadata.items() if k.startswith("tokenizer.")}
        self.lltokenizer = None
        self.matmul_dtype = matmul_dtype
        names = c.expected_tensors()
        for name in g.tensors:
            if name not in names:
                raise _unsupported(f"{path}: tensor '{name}' is not supported by numpy_llama "
                                   f"for architecture '{c.arch}' (computing without it would "
                                   "be silently wrong)")
        self.tok_embd = self._load(g, "token_embd.weight", (c.n_vocab, c.n_embd), matrix=False)
        tied = "output.weight" not in g.tensors
        self.output = (self.tok_embd.astype(matmul_dtype, copy=False) if tied else
                       self._load(g, "output.weight", (c.n_vocab, c.n_embd)))
        self.output_norm = self._load(g, "output_norm.weight", (c.n_embd,), matrix=False)
        rope_freqs = (self._load(g, "rope_freqs.weight", (c.head_dim // 2,), matrix=False)
                      if "rope_freqs.weight" in g.tensors else None)
        self.inv_freq = self._inv_freqs(c, rope_freqs)
        self.layers = [{k: self._load(g, f"blk.{i}.{k}.weight", s, matrix=len(s) == 2)
                        for k, s in c.layer_shapes().items()} for i in range(c.n_layer)]

    @staticmethod
    def _inv_freqs(c, rope_freqs):
        """Per layer: base^(-2i/n_rot) (/ rope_freqs), float64; one array per distinct base."""
        half = np.arange(c.n_rot // 2, dtype=F64)
        by_base = {}
        for lc in c.layers:
            if lc.rope_base not in by_base:
                f = np.power(lc.rope_base, -2.0 * half / c.n_rot)
                by_base[lc.rope_base] = f if rope_freqs is None else f / rope_freqs.astype(F64)
        return [by_base[lc.rope_base] for lc in c.layers]

    def _load(self, g, name, shape, matrix=True):
        if name not in g.tensors:
            raise EngineError(TS_ERR_IO, f"{g.path}: tensor '{name}' is missing")
        try:
            w = g.dequantize(name)
        except NotImplementedError as e:
            raise _unsupported(f"{g.path}: {e}") from None
        if w.shape != tuple(shape):
            raise EngineError(TS_ERR_IO, f"{g.path}: tensor '{name}' has shape {w.shape}, "
                              f"expected {tuple(shape)}")
        w = np.ascontiguousarray(w, dtype=F32)
        return w.astype(self.matmul_dtype, copy=False) if matrix else w


def rms_norm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w, in float64, rounded once (along the last axis)."""
    x64 = x.astype(F64)
    inv = 1.0 / np.sqrt((x64 * x64).sum(axis=-1, keepdims=True) / x.shape[-1] + eps)
    return (x64 * inv * w.astype(F64)).astype(F32)


def head_norm(x, w, eps):
    """Per-head RMSNorm of x [n, n_heads * head_dim] with w [head_dim] (QK-norm)."""
    n, hd = x.shape[0], w.shape[0]
    return rms_norm(x.reshape(n, -1, hd), w, eps).reshape(n, -1)


def gelu_tanh(g):
    """0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) of float64 g (ops::gelu_tanh)."""
    return 0.5 * g * (1.0 + np.tanh(0.79788456080286535587989211986876 *
                                    (g + 0.044715 * g * g * g)))


def silu(g):
    """g / (1 + exp(-g)) of float64 g (ops::silu)."""
    with np.errstate(over="ignore"):  # exp(-g) = inf for g << 0: SiLU(g) = -0.0
        return g / (1.0 + np.exp(-g))


def matmul(h, w):
    """h [n, in] @ w[out, in].T, accumulated in the weights' dtype, rounded to f32."""
    return (h.astype(w.dtype, copy=False) @ w.T).astype(F32)


def rope(c, x, positions, inv_freq, scale):
    """RoPE of every head of x [n, n_heads * head_dim] (float64 maths): interleaved
    pairs (2i, 2i+1), or NeoX pairs (i, i + head_dim/2) when c.neox_rope."""
    n, half = x.shape[0], c.head_dim // 2
    theta = (positions.astype(F64) / scale)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if c.neox_rope:
        v = x.astype(F64).reshape(n, -1, 2, half)
        x0, x1 = v[:, :, 0], v[:, :, 1]
        out = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=2)
    else:
        v = x.astype(F64).reshape(n, -1, half, 2)
        x0, x1 = v[..., 0], v[..., 1]
        out = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(n, -1).astype(F32)


class LlamaSession(Session):
    def __init__(self, model, max_context):
        self.m, c = model, model.c
        self.max_ctx = max_context or c.n_ctx
        kv_dim = c.n_head_kv * c.head_dim
        # np.zeros is calloc: pages are touched only as positions are written
        self.k_cache = np.zeros((c.n_layer, self.max_ctx, kv_dim), F32)
        self.v_cache = np.zeros((c.n_layer, self.max_ctx, kv_dim), F32)
        self.pos = 0
        self.block_end = 0  # > 0 inside a bidirectional prefill_embeddings: its end position
        self.taps_on = False
        self.taps = None

    def compile_grammar(self, kind, text):
        """ABI v7: the grammar enforced by llguidance (llguidance_grammar.py); without
        llguidance, TS_ERR_UNSUPPORTED and the harness applies the grammar itself."""
        try:
            from . import llguidance_grammar as LG
            import llguidance  # noqa: F401
        except ImportError:
            raise _unsupported("numpy_llama enforces grammars with llguidance, which this "
                               "Python cannot import (pip install llguidance==1.9.1)") from None
        if self.m.lltokenizer is None:
            self.m.lltokenizer = LG.lltokenizer(self.m.tokenizer_md)
        return LG.compile_grammar(self.m.lltokenizer, kind, text, self.m.lltokenizer.eos_tokens)

    def position(self):
        return self.pos

    def max_context(self):
        return self.max_ctx

    def rewind(self, position):
        self.pos = position  # entries >= position are overwritten before they are read

    def set_taps(self, on):
        self.taps_on = bool(on)
        self.taps = None

    def read_taps(self):
        return self.taps

    def prefill(self, tokens, all_positions):
        x = self.forward(np.asarray(tokens, dtype=np.int64))
        return output_logits(self.m, x if all_positions else x[-1:])

    def n_embd(self):
        return self.m.c.n_embd

    def prefill_embeddings(self, embeddings, n_embd, bidirectional, all_positions):
        """ABI v8: rows given in place of looked-up tokens (no embedding scale); with
        bidirectional, each row also attends to the block's later rows (Gemma 3's image
        block: HF's token_type_ids mask OR'ed with the causal one, the sliding window
        still applied to earlier keys)."""
        rows = np.frombuffer(embeddings, dtype="<f4").reshape(-1, n_embd).astype(F32)
        self.block_end = self.pos + rows.shape[0] if bidirectional else 0
        try:
            x = forward_segments(self.m, [(self, rows.shape[0])], None, rows)
        finally:
            self.block_end = 0
        return output_logits(self.m, x if all_positions else x[-1:])

    def fork(self, n_prefix):
        """A new session whose cache holds this one's first n_prefix positions (copied)."""
        s = LlamaSession(self.m, self.max_ctx)
        s.k_cache[:, :n_prefix] = self.k_cache[:, :n_prefix]
        s.v_cache[:, :n_prefix] = self.v_cache[:, :n_prefix]
        s.pos = n_prefix
        return s

    def _attention(self, q, layer, p0, n):
        """Causal GQA attention of n queries at positions p0.. over the cache [0, p0 + n),
        within the layer's sliding window. Scores, softmax and the weighted sum in float64
        (float32 products when the matmuls are float32); each block of queries reads
        only the keys it can see."""
        c = self.m.c
        hd, group, T, window = c.head_dim, c.n_head // c.n_head_kv, p0 + n, c.layers[layer].window
        dt = F64 if self.m.matmul_dtype == F64 else F32
        first = max(0, p0 - window + 1) if window > 0 else 0  # oldest key any query sees
        keys = self.k_cache[layer, first:T].astype(dt).reshape(T - first, c.n_head_kv, hd)
        vals = self.v_cache[layer, first:T].astype(dt).reshape(T - first, c.n_head_kv, hd)
        kT = keys.transpose(1, 2, 0)[:, None]  # [kv, 1, hd, T - first]
        vv = vals.transpose(1, 0, 2)[:, None]  # [kv, 1, T - first, hd]
        out = np.empty((n, c.n_head * hd), F32)
        t = np.arange(first, T)
        for i0 in range(0, n, QUERY_BLOCK):
            i1 = min(n, i0 + QUERY_BLOCK)
            # keys after the block's last query (the bidirectional block's end), or before
            # its first query's window, are masked anyway
            end = max(p0 + i1, self.block_end) - first
            lo = max(0, p0 + i0 - window + 1 - first) if window > 0 else 0
            qb = q[i0:i1].astype(dt).reshape(i1 - i0, c.n_head_kv, group, hd)
            s = (qb.transpose(1, 2, 0, 3) @ kT[..., lo:end]).astype(F64) * c.attn_scale
            pos = (p0 + np.arange(i0, i1))[:, None]
            masked = t[None, lo:end] > np.maximum(pos, self.block_end - 1)
            if window > 0:
                masked |= t[None, lo:end] < pos - window + 1
            s[:, :, masked] = -np.inf
            s = np.exp(s - s.max(axis=-1, keepdims=True))  # [kv, group, nb, end - lo]
            o = (s.astype(dt, copy=False) @ vv[:, :, lo:end]) / s.sum(axis=-1, keepdims=True)
            out[i0:i1] = o.transpose(2, 0, 1, 3).reshape(i1 - i0, -1).astype(F32)
        return out

    def forward(self, tokens):
        return forward_segments(self.m, [(self, len(tokens))], tokens)


def output_logits(m, rows):
    """Logits [n, n_vocab] of the final hidden rows (soft-capped when the model says so)."""
    out = np.empty((rows.shape[0], m.n_vocab), F32)
    cap = m.c.softcap
    for i in range(0, rows.shape[0], QUERY_BLOCK):  # bounds the float64 temporaries
        h = rms_norm(rows[i:i + QUERY_BLOCK], m.output_norm, m.c.eps)
        logits = matmul(h, m.output)
        if cap:
            logits = (cap * np.tanh(logits.astype(F64) / cap)).astype(F32)
        out[i:i + QUERY_BLOCK] = logits
    return out


def embed(m, tokens):
    """x = token_embd[token] * embd_scale (float64 product, rounded once)."""
    e = m.tok_embd[np.asarray(tokens, dtype=np.int64)]
    return e if m.c.embd_scale == 1.0 else (e.astype(F64) * m.c.embd_scale).astype(F32)


def attention_block(m, li, x, positions, spans):
    """Layer li's attention block output (post-normed when the family says so) for the
    rows x; writes each segment's K/V into its session's cache."""
    c, L = m.c, m.layers[li]
    h = rms_norm(x, L["attn_norm"], c.eps)
    q, k, v = matmul(h, L["attn_q"]), matmul(h, L["attn_k"]), matmul(h, L["attn_v"])
    if c.qk_norm:
        q, k = head_norm(q, L["attn_q_norm"], c.eps), head_norm(k, L["attn_k_norm"], c.eps)
    inv_freq, scale = m.inv_freq[li], c.layers[li].rope_scale
    q, k = rope(c, q, positions, inv_freq, scale), rope(c, k, positions, inv_freq, scale)
    att = np.empty((x.shape[0], c.n_head * c.head_dim), F32)
    for session, p0, n, o in spans:
        session.k_cache[li, p0:p0 + n] = k[o:o + n]
        session.v_cache[li, p0:p0 + n] = v[o:o + n]
        att[o:o + n] = session._attention(q[o:o + n], li, p0, n)
    a = matmul(att, L["attn_output"])
    return rms_norm(a, L["post_attention_norm"], c.eps) if c.post_norms else a


def ffn_block(m, li, x):
    """Layer li's gated FFN output (SwiGLU or GeGLU; post-normed when the family says so)."""
    c, L = m.c, m.layers[li]
    h = rms_norm(x, L["ffn_norm"], c.eps)
    g = matmul(h, L["ffn_gate"]).astype(F64)
    u = matmul(h, L["ffn_up"]).astype(F64)
    act = gelu_tanh(g) if c.gelu else silu(g)
    f = matmul((act * u).astype(F32), L["ffn_down"])
    return rms_norm(f, L["post_ffw_norm"], c.eps) if c.post_norms else f


def forward_segments(m, segments, tokens, rows=None):
    """The hidden rows of the concatenated tokens of several sequences in one pass:
    segments = [(session, n_tokens)] in order, each appended at its own position
    (rows: input embeddings in place of the tokens' looked-up ones).
    Every matrix product runs once over all the rows; attention runs per sequence
    over its own cache. Advances each session; returns x [len(tokens), n_embd]."""
    c = m.c
    spans, o = [], 0
    for session, n in segments:
        spans.append((session, session.pos, n, o))
        o += n
    positions = np.concatenate([np.arange(p0, p0 + n) for _, p0, n, _ in spans])
    x = embed(m, tokens) if rows is None else rows
    taps = {i: np.zeros((c.n_layer, 3, c.n_embd), F32)
            for i, (s, _, _, _) in enumerate(spans) if s.taps_on}
    for li in range(c.n_layer):
        a = attention_block(m, li, x, positions, spans)
        x = (x.astype(F64) + a).astype(F32)
        f = ffn_block(m, li, x)
        x = (x.astype(F64) + f).astype(F32)
        for i, t in taps.items():
            last = spans[i][3] + spans[i][2] - 1
            t[li] = (a[last], f[last], x[last])
    for i, (session, p0, n, _) in enumerate(spans):
        session.pos = p0 + n
        if i in taps:
            session.taps = taps[i].reshape(-1)
    return x


class NumpyLlama(Engine):
    name = "numpy_llama"
    version = "0.2.0"
    architectures = ",".join(FAMILY_KEYS)
    # beyond a plain Llama (docs/model-families.md): what Config accepts
    model_features = ("neox_rope,key_length_head_dim,rope_freqs,linear_rope_scaling,"
                      "sliding_window,per_layer_rope_base,qk_norm,post_norms,geglu,"
                      "embedding_scale,attention_scale,final_logit_softcap")
    session_class = LlamaSession
    WEIGHT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K",
                    "Q6_K")

    def __init__(self):
        kind = os.environ.get("TOUCHSTONE_NUMPY_MATMUL", "float32")
        if kind not in ("float32", "float64"):
            raise EngineError(TS_ERR_INVALID_ARGUMENT,
                              f"TOUCHSTONE_NUMPY_MATMUL={kind!r}: expected float32 or float64")
        self.matmul_dtype = np.dtype(kind)

    def device_name(self):
        return (f"CPU: NumPy {np.__version__}, {self.matmul_dtype.name} matmul accumulation "
                f"({_cpu_model()})")

    def capabilities(self):
        bits = 0
        for t in self.WEIGHT_TYPES:
            bits |= weight_type_bit(t)
        # step_batch is one pass (TS_CAP_BATCHED_SESSIONS), not batch invariant:
        # BLAS blocks a product of more rows differently.
        return Capabilities(flags=TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BATCHED_SESSIONS,
                            weight_types=bits,
                            determinism_note="BLAS GEMM (prefill) and GEMV (decode) sum in "
                            "different orders; OpenBLAS threads may split sums")

    def load_model(self, path):
        return Model(path, self.matmul_dtype)

    def open_session(self, model, options):
        if not options.full_precision:
            raise _unsupported("numpy_llama computes with weights dequantized to float32 only "
                               "(--weights full_precision); it has no quantized path")
        return LlamaSession(model, options.max_context)

    def step_batch(self, entries):
        """Every entry in one forward pass (forward_segments), then one output
        product over the rows asked for; each entry's logits as its prefill's."""
        m = entries[0].session.m
        tokens = np.concatenate([np.asarray(e.tokens, dtype=np.int64) for e in entries])
        x = forward_segments(m, [(e.session, len(e.tokens)) for e in entries], tokens)
        picks, o = [], 0
        for e in entries:
            n = len(e.tokens)
            picks.append(x[o:o + n] if e.all_positions else x[o + n - 1:o + n])
            o += n
        out = output_logits(m, np.concatenate(picks))
        bounds = np.cumsum([0] + [p.shape[0] for p in picks])
        return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def fork(self, session, n_prefix):
        return session.fork(n_prefix)


def _cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    serve(NumpyLlama)
