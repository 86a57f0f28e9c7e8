"""numpy_llama: a Llama forward pass in NumPy, served to the Touchstone harness.

    touchstone parity --backend "exec:python3 -m touchstone_engine.examples.numpy_llama" \\
        --weights full_precision --manifest goldens/manifest.json

Reads the GGUF itself (gguf_reader.py), dequantizes every weight to float32 at
load, and computes the way the scalar reference does
(reference/model/src/reference_forward.cpp), in whole-sequence NumPy form:

    x   = token_embd[token]
    per layer:  h = RMSNorm(x) * attn_norm
                q, k, v = Wq h, Wk h, Wv h
                RoPE(q), RoPE(k): interleaved pairs (2i, 2i+1), theta = pos * base^(-2i/n_rot).
                  llama.cpp's converter permuted the Q/K rows of GGUF "llama" models
                  so that this equals HF's rotate_half on the original weights.
                attention per query head h over KV head h // (n_head / n_head_kv) (GQA),
                  causal, scale 1/sqrt(head_dim), softmax with the max subtracted
                x += Wo attn;  h = RMSNorm(x) * ffn_norm;  x += Wdown(SiLU(Wgate h) * Wup h)
    logits = W_out (RMSNorm(x) * output_norm)        (W_out = token_embd when tied)

Numerics: activations are stored as float32 and rounded where the reference
rounds them (after every matrix product, norm, RoPE, attention and residual
add); norms, RoPE, softmax and SiLU are evaluated in float64. Matrix products
(and attention's QK and PV products) run in TOUCHSTONE_NUMPY_MATMUL:
  float32 (default)  OpenBLAS sgemm/sgemv on float32 weights: within the exact
                     profile on the whole SmolLM2 suite (NMSE <= 2.1e-11);
  float64            weights kept as float64 copies (twice the memory), dgemm:
                     the reference's accumulation precision: bit for bit equal
                     logits on every SmolLM2 item of 781 tokens or fewer.
docs/python-engines.md has the numbers of both.
Threads: OpenBLAS's own (OPENBLAS_NUM_THREADS); the session's n_threads is not used.
"""

import math
import os

import numpy as np

from touchstone_engine import (TS_CAP_ALL_POSITION_LOGITS, TS_CAP_BATCHED_SESSIONS,
                               TS_ERR_INVALID_ARGUMENT, TS_ERR_IO,
                               TS_ERR_UNSUPPORTED, Capabilities, Engine, EngineError, Session,
                               serve, weight_type_bit)
from touchstone_engine.examples.gguf_reader import GGUFError, GGUFFile

F32, F64 = np.float32, np.float64
QUERY_BLOCK = 256  # queries per attention block (bounds the score matrix)

# "llama.*" keys this engine reads or that cannot change what it computes; any
# other key changes the model and is refused by name (as the reference does).
KNOWN_KEYS = {
    "block_count", "context_length", "embedding_length", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "rope.freq_base", "rope.dimension_count",
    "attention.layer_norm_rms_epsilon", "vocab_size", "attention.key_length",
    "attention.value_length", "rope.scaling.type", "rope.scaling.factor",
    "rope.scaling.original_context_length", "attention.sliding_window"}


def _unsupported(msg):
    return EngineError(TS_ERR_UNSUPPORTED, msg)


class Config:
    def __init__(self, g):
        md = g.metadata
        arch = md.get("general.architecture")
        if arch != "llama":
            raise _unsupported(f"{g.path}: architecture '{arch}' is not computed by numpy_llama "
                               "(supported: llama)")
        for key in md:
            if key.startswith("llama.") and key[6:] not in KNOWN_KEYS:
                raise _unsupported(f"{g.path}: metadata key '{key}' is not supported by "
                                   "numpy_llama (computing without it would be silently wrong)")

        def get(k, default=None):
            v = md.get("llama." + k, default)
            if v is None:
                raise EngineError(TS_ERR_IO, f"{g.path}: metadata key 'llama.{k}' is missing")
            return v

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
        self.rope_scale = self._rope_scale(g, md)
        self.window = int(get("attention.sliding_window", 0))
        tokens = md.get("tokenizer.ggml.tokens")
        self.n_vocab = int(md.get("llama.vocab_size", len(tokens) if tokens else 0))
        if min(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_vocab) <= 0 or \
                self.n_head % self.n_head_kv:
            raise EngineError(TS_ERR_IO, f"{g.path}: inconsistent model shape")

    @staticmethod
    def _rope_scale(g, md):
        kind = md.get("llama.rope.scaling.type", "none")
        factor = float(md.get("llama.rope.scaling.factor", 0.0) or 0.0)
        if kind == "none":
            if factor not in (0.0, 1.0):
                raise _unsupported(f"{g.path}: rope.scaling.factor {factor} without a type")
            return 1.0
        if kind != "linear" or not factor >= 1.0:
            raise _unsupported(f"{g.path}: rope.scaling.type '{kind}' (factor {factor}) is not "
                               "supported (only 'none' and 'linear')")
        return factor


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
        self.matmul_dtype = matmul_dtype
        names = self._expected_tensors(g)
        for name in g.tensors:
            if name not in names:
                raise _unsupported(f"{path}: tensor '{name}' is not supported by numpy_llama "
                                   "(computing without it would be silently wrong)")
        self.tok_embd = self._load(g, "token_embd.weight", (c.n_vocab, c.n_embd), matrix=False)
        tied = "output.weight" not in g.tensors
        self.output = self._load(g, "token_embd.weight" if tied else "output.weight",
                                 (c.n_vocab, c.n_embd))
        self.output_norm = self._load(g, "output_norm.weight", (c.n_embd,), matrix=False)
        self.rope_freqs = (self._load(g, "rope_freqs.weight", (c.head_dim // 2,), matrix=False)
                           if "rope_freqs.weight" in g.tensors else None)
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        shapes = {"attn_norm": (c.n_embd,), "attn_q": (q_dim, c.n_embd),
                  "attn_k": (kv_dim, c.n_embd), "attn_v": (kv_dim, c.n_embd),
                  "attn_output": (c.n_embd, q_dim), "ffn_norm": (c.n_embd,),
                  "ffn_gate": (c.n_ff, c.n_embd), "ffn_up": (c.n_ff, c.n_embd),
                  "ffn_down": (c.n_embd, c.n_ff)}
        self.layers = [{k: self._load(g, f"blk.{i}.{k}.weight", s, matrix=len(s) == 2)
                        for k, s in shapes.items()} for i in range(c.n_layer)]

    @staticmethod
    def _expected_tensors(g):
        names = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}
        n_layer = int(g.metadata.get("llama.block_count", 0))
        for i in range(n_layer):
            for k in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                      "ffn_gate", "ffn_up", "ffn_down"):
                names.add(f"blk.{i}.{k}.weight")
        return names

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
        return w.astype(self.matmul_dtype) if matrix else w


def rms_norm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w, in float64, rounded once (rows of x)."""
    x64 = x.astype(F64)
    inv = 1.0 / np.sqrt((x64 * x64).sum(axis=-1, keepdims=True) / x.shape[-1] + eps)
    return (x64 * inv * w.astype(F64)).astype(F32)


class LlamaSession(Session):
    def __init__(self, model, max_context):
        self.m, c = model, model.c
        self.max_ctx = max_context or c.n_ctx
        kv_dim = c.n_head_kv * c.head_dim
        # np.zeros is calloc: pages are touched only as positions are written
        self.k_cache = np.zeros((c.n_layer, self.max_ctx, kv_dim), F32)
        self.v_cache = np.zeros((c.n_layer, self.max_ctx, kv_dim), F32)
        self.pos = 0
        self.taps_on = False
        self.taps = None
        half = np.arange(c.n_rot // 2, dtype=F64)
        self.inv_freq = np.power(c.rope_base, -2.0 * half / c.n_rot)
        if model.rope_freqs is not None:
            self.inv_freq = self.inv_freq / model.rope_freqs.astype(F64)

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

    def fork(self, n_prefix):
        """A new session whose cache holds this one's first n_prefix positions (copied)."""
        s = LlamaSession(self.m, self.max_ctx)
        s.k_cache[:, :n_prefix] = self.k_cache[:, :n_prefix]
        s.v_cache[:, :n_prefix] = self.v_cache[:, :n_prefix]
        s.pos = n_prefix
        return s

    def _mm(self, h, w):
        """h [n, in] @ w[out, in].T, accumulated in the model's matmul dtype, rounded to f32."""
        return (h.astype(w.dtype, copy=False) @ w.T).astype(F32)

    def _rope(self, x, positions):
        """Interleaved RoPE of every head of x [n, n_heads * head_dim] (float64 maths)."""
        c = self.m.c
        n = x.shape[0]
        theta = (positions.astype(F64) / c.rope_scale)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        v = x.astype(F64).reshape(n, -1, c.head_dim // 2, 2)
        x0, x1 = v[..., 0], v[..., 1]
        out = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
        return out.reshape(n, -1).astype(F32)

    def _attention(self, q, layer, p0, n):
        """Causal GQA attention of n queries at positions p0.. over the cache [0, p0 + n).
        Scores, softmax and the weighted sum in float64 (float32 products when the
        matmuls are float32); each block of queries reads only the keys it can see."""
        c = self.m.c
        hd, group, T = c.head_dim, c.n_head // c.n_head_kv, p0 + n
        dt = F64 if self.m.matmul_dtype == F64 else F32
        first = max(0, p0 - c.window + 1) if c.window > 0 else 0  # oldest key any query sees
        keys = self.k_cache[layer, first:T].astype(dt).reshape(T - first, c.n_head_kv, hd)
        vals = self.v_cache[layer, first:T].astype(dt).reshape(T - first, c.n_head_kv, hd)
        kT = keys.transpose(1, 2, 0)[:, None]  # [kv, 1, hd, T - first]
        vv = vals.transpose(1, 0, 2)[:, None]  # [kv, 1, T - first, hd]
        out = np.empty((n, c.n_head * hd), F32)
        scale = 1.0 / math.sqrt(hd)
        t = np.arange(first, T)
        for i0 in range(0, n, QUERY_BLOCK):
            i1 = min(n, i0 + QUERY_BLOCK)
            end = p0 + i1 - first  # keys after the block's last query are masked anyway
            qb = q[i0:i1].astype(dt).reshape(i1 - i0, c.n_head_kv, group, hd)
            s = (qb.transpose(1, 2, 0, 3) @ kT[..., :end]).astype(F64) * scale
            pos = (p0 + np.arange(i0, i1))[:, None]
            masked = t[None, :end] > pos
            if c.window > 0:
                masked |= t[None, :end] < pos - c.window + 1
            s[:, :, masked] = -np.inf
            s = np.exp(s - s.max(axis=-1, keepdims=True))  # [kv, group, nb, end]
            o = (s.astype(dt, copy=False) @ vv[:, :, :end]) / s.sum(axis=-1, keepdims=True)
            out[i0:i1] = o.transpose(2, 0, 1, 3).reshape(i1 - i0, -1).astype(F32)
        return out

    def forward(self, tokens):
        return forward_segments(self.m, [(self, len(tokens))], tokens)


def output_logits(m, rows):
    """Logits [n, n_vocab] of the final hidden rows."""
    out = np.empty((rows.shape[0], m.n_vocab), F32)
    for i in range(0, rows.shape[0], QUERY_BLOCK):  # bounds the float64 temporaries
        h = rms_norm(rows[i:i + QUERY_BLOCK], m.output_norm, m.c.eps)
        out[i:i + QUERY_BLOCK] = (h.astype(m.output.dtype, copy=False) @ m.output.T).astype(F32)
    return out


def forward_segments(m, segments, tokens):
    """The hidden rows of the concatenated tokens of several sequences in one pass:
    segments = [(session, n_tokens)] in order, each appended at its own position.
    Every matrix product runs once over all the rows; attention runs per sequence
    over its own cache. Advances each session; returns x [len(tokens), n_embd]."""
    c, s0 = m.c, segments[0][0]
    spans, o = [], 0
    for session, n in segments:
        spans.append((session, session.pos, n, o))
        o += n
    positions = np.concatenate([np.arange(p0, p0 + n) for _, p0, n, _ in spans])
    x = m.tok_embd[np.asarray(tokens, dtype=np.int64)].astype(F32)
    taps = {i: np.zeros((c.n_layer, 3, c.n_embd), F32)
            for i, (s, _, _, _) in enumerate(spans) if s.taps_on}
    for li, L in enumerate(m.layers):
        h = rms_norm(x, L["attn_norm"], c.eps)
        q = s0._rope(s0._mm(h, L["attn_q"]), positions)
        k = s0._rope(s0._mm(h, L["attn_k"]), positions)
        v = s0._mm(h, L["attn_v"])
        att = np.empty((x.shape[0], c.n_head * c.head_dim), F32)
        for session, p0, n, o in spans:
            session.k_cache[li, p0:p0 + n] = k[o:o + n]
            session.v_cache[li, p0:p0 + n] = v[o:o + n]
            att[o:o + n] = session._attention(q[o:o + n], li, p0, n)
        a = s0._mm(att, L["attn_output"])
        x = (x.astype(F64) + a).astype(F32)
        h = rms_norm(x, L["ffn_norm"], c.eps)
        g = s0._mm(h, L["ffn_gate"]).astype(F64)
        u = s0._mm(h, L["ffn_up"]).astype(F64)
        with np.errstate(over="ignore"):  # exp(-g) = inf for g << 0: SiLU(g) = -0.0
            act = g / (1.0 + np.exp(-g))
        f = s0._mm((act * u).astype(F32), L["ffn_down"])
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
    version = "0.1.0"
    architectures = "llama"
    # beyond a plain Llama (docs/model-families.md): what Config accepts
    model_features = "key_length_head_dim,rope_freqs,linear_rope_scaling,sliding_window"
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
