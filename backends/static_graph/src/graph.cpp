// graph.cpp - the step graph of every ModelConfig family as TOSA 1.0 text (see
// graph.h; the formulas are reference_forward.cpp's).
#include "graph.h"

#include "graph_build.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace touchstone::static_graph {
using namespace graph_build;
namespace {

std::string ident(const std::string& name) {
  std::string id;
  for (char c : name) id += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return id;
}

// One function being built: its emitter and parameters.
struct Fn {
  Emitter e;
  std::vector<Val> params;
  Val param(const std::string& name, const Shape& s, const std::string& elem) {
    Val v{"%" + ident(name), s, elem};
    params.push_back(v);
    return v;
  }
};

struct MatrixPart {
  std::string suffix;
  Shape shape;
  std::string elem;
};

// Graph arguments of one weight matrix used as y[T, out] = x[T, in] . M[in, out], or of
// `count` such matrices stacked (experts: F32 [count, in, out], blocks count * nb).
std::vector<MatrixPart> matrix_parts(int64_t in, int64_t outd, MatrixFormat f, int64_t count = 1) {
  const int64_t nb = count * (in / block_rows(f));
  switch (f) {
    case MatrixFormat::F32:
      return {{"", {count, in, outd}, "f32"}};
    case MatrixFormat::Q4_0:
      return {{".qs", {nb, 16, outd}, "i8"}, {".d", {nb, 1, outd}, "f16"}};
    case MatrixFormat::Q4_1:
      return {{".qs", {nb, 16, outd}, "i8"},
              {".d", {nb, 1, outd}, "f16"},
              {".m", {nb, 1, outd}, "f16"}};
    case MatrixFormat::Q8_0:
      return {{".qs", {nb, 32, outd}, "i8"}, {".d", {nb, 1, outd}, "f16"}};
    case MatrixFormat::Q4_1F:
      return {{".qs", {nb, 16, outd}, "i8"},
              {".d", {nb, 1, outd}, "f32"},
              {".m", {nb, 1, outd}, "f32"}};
    case MatrixFormat::Q8_16F:
      return {{".qs", {nb, 16, outd}, "i8"}, {".d", {nb, 1, outd}, "f32"}};
    case MatrixFormat::Q8_1:
    case MatrixFormat::Q8_1F: {
      const std::string se = f == MatrixFormat::Q8_1 ? "f16" : "f32";
      return {{".qs", {nb, 32, outd}, "i8"}, {".d", {nb, 1, outd}, se}, {".m", {nb, 1, outd}, se}};
    }
  }
  throw std::logic_error("matrix_parts: bad format");
}

// A scale part as f32 (f16 parts cast, f32 ones as they are).
Val scale_f32(Emitter& e, const Val& v) { return v.elem == "f32" ? v : e.cast(v, "f32"); }

// The fp32 [1, nb*block_rows, out] operand of a block matrix from its parts
// (qs, d[, m]) of nb blocks (dequantized in the graph; F32: the part itself).
// Each weight is ggml's dequantized value, bitwise: q*d + m (Q4_1, Q4_1F with
// m = -dmin*m, Q8_1, Q8_1F), (q-8)*d (Q4_0), q*d (Q8_0, Q8_16F).
Val dequantize(Emitter& e, const std::vector<Val>& p, MatrixFormat f, int64_t nb, int64_t outd) {
  const int64_t in = nb * block_rows(f);
  switch (f) {
    case MatrixFormat::F32:
      return p[0];
    case MatrixFormat::Q4_0:
    case MatrixFormat::Q4_1:
    case MatrixFormat::Q4_1F: {
      // Element j of block b is nibble h = j / 16 of byte j % 16 (low nibbles are
      // elements 0-15, ggml's order): shift the bytes, broadcast along h, by
      // [0, 4] and mask -> [nb][2][16][out]. Only broadcasting elementwise ops
      // and one reshape (no concat), so that the schedule can fuse the whole
      // dequantization into the matmul's tiles (compiler.cpp).
      Val qs = e.reshape(p[0], {nb, 1, 16, outd});
      Val sh = e.reshape(e.const_i32({2}, {0, 4}), {1, 2, 1, 1});
      Val nib =
          e.binary("tosa.bitwise_and", e.binary("tosa.logical_right_shift", qs, e.cast(sh, "i8")),
                   e.splat({1, 1, 1, 1}, "i8", "15"));
      Val q = e.cast(nib, "f32");  // [nb][2][16][out]
      Val d = scale_f32(e, e.reshape(p[1], {nb, 1, 1, outd}));
      Val w;
      if (f != MatrixFormat::Q4_0) {
        w = e.add(e.mul(q, d), scale_f32(e, e.reshape(p[2], {nb, 1, 1, outd})));  // q*d + m
      } else {
        w = e.mul(e.sub(q, e.splat({1, 1, 1, 1}, "f32", "8.0")), d);  // (q-8)*d (ggml order)
      }
      return e.reshape(w, {1, in, outd});
    }
    case MatrixFormat::Q8_0:
    case MatrixFormat::Q8_16F:
      return e.reshape(e.mul(e.cast(p[0], "f32"), scale_f32(e, p[1])), {1, in, outd});
    case MatrixFormat::Q8_1:
    case MatrixFormat::Q8_1F:
      return e.reshape(e.add(e.mul(e.cast(p[0], "f32"), scale_f32(e, p[1])), scale_f32(e, p[2])),
                       {1, in, outd});
  }
  throw std::logic_error("dequantize: bad format");
}

// Declares the matrix parameters in fn and returns its fp32 operands, one per
// slice of the input dim: [1, in, out] when slices == 1 (the normal case), else
// `slices` operands [1, c_k, out] of whole 32-blocks (the thread_order_reduction
// fault). Emitted where the parameters are declared, as before the fault existed.
// count > 1 (experts): one operand [count, in, out], never sliced.
std::vector<Val> matrix(Fn& fn, const std::string& name, int64_t in, int64_t outd, MatrixFormat f,
                        int64_t slices = 1, int64_t count = 1) {
  std::vector<Val> p;
  for (const MatrixPart& part : matrix_parts(in, outd, f, count))
    p.push_back(fn.param(name + part.suffix, part.shape, part.elem));
  Emitter& e = fn.e;
  const int64_t nb = in / block_rows(f);
  if (count > 1) return {e.reshape(dequantize(e, p, f, count * nb, outd), {count, in, outd})};
  if (slices <= 1) return {dequantize(e, p, f, nb, outd)};
  std::vector<Val> out;
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t b0 = nb * k / slices, b1 = nb * (k + 1) / slices;
    if (b1 == b0) continue;
    std::vector<Val> ps;
    for (const Val& v : p) {  // F32 [1, in, out]: rows; blocks [nb, r, out]: blocks
      Shape start(v.shape.size(), 0), size = v.shape;
      const size_t ax = f == MatrixFormat::F32 ? 1 : 0;
      const int64_t unit = f == MatrixFormat::F32 ? block_rows(f) : 1;
      start[ax] = b0 * unit;
      size[ax] = (b1 - b0) * unit;
      ps.push_back(e.slice(v, start, size));
    }
    out.push_back(dequantize(e, ps, f, b1 - b0, outd));
  }
  return out;
}

std::string signature(const std::vector<Val>& params) {
  std::string s;
  for (size_t i = 0; i < params.size(); ++i)
    s += (i ? ", " : "") + params[i].name + ": " + tensor_type(params[i]);
  return s;
}

std::string types(const std::vector<Val>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + tensor_type(vs[i]);
  return s;
}

std::string names(const std::vector<Val>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + vs[i].name;
  return s;
}

// x / sqrt(mean(x^2) + eps) * w over the rows of x [R, n], w [1, n].
Val rms_norm(Emitter& em, const Ctx& C, const Val& x, const Val& w) {
  Val ss = em.reduce("tosa.reduce_sum", em.mul(x, x), 1);
  Val ms = em.add(em.mul(ss, em.splat({1, 1}, "f32", fmt_float(1.0 / double(x.shape[1])))),
                  em.splat({1, 1}, "f32", fmt_float(C.eps)));
  return em.mul(em.mul(x, em.unary("tosa.rsqrt", ms)), w);
}

// RoPE on x [T, n, hd] with c, s [T, 1, half, 1] (half = n_rot / 2): the first
// n_rot dims of each head rotate, the others pass through (partial rotary).
// Interleaved pairs (2i, 2i+1) (GGUF's permuted Llama Q/K) or NeoX pairs
// (i, i + half) (Qwen2/3, Gemma 3, Phi-3); the rope_layout fault swaps the two.
Val rope(Emitter& em, const Ctx& C, const Val& x, const Val& c, const Val& s) {
  const int64_t T = C.T, n = x.shape[1], half = C.half, rot = 2 * half;
  if (rot < C.hd) {
    Ctx R = C;  // the rotating part as a head of n_rot dims
    R.hd = rot;
    Val xr = rope(em, R, em.slice(x, {0, 0, 0}, {T, n, rot}), c, s);
    return em.concat({xr, em.slice(x, {0, 0, rot}, {T, n, C.hd - rot})}, 2);
  }
  if (C.M.neox_rope != C.F.rope_layout) {
    Val p = em.reshape(x, {T, n, 2, half});
    Val cc = em.reshape(c, {T, 1, 1, half}), ss = em.reshape(s, {T, 1, 1, half});
    Val x0 = em.slice(p, {0, 0, 0, 0}, {T, n, 1, half});
    Val x1 = em.slice(p, {0, 0, 1, 0}, {T, n, 1, half});
    Val y0 = em.sub(em.mul(x0, cc), em.mul(x1, ss));
    Val y1 = em.add(em.mul(x0, ss), em.mul(x1, cc));
    return em.reshape(em.concat({y0, y1}, 2), {T, n, C.hd});
  }
  Val p = em.reshape(x, {T, n, half, 2});
  Val x0 = em.slice(p, {0, 0, 0, 0}, {T, n, half, 1});
  Val x1 = em.slice(p, {0, 0, 0, 1}, {T, n, half, 1});
  Val y0 = em.sub(em.mul(x0, c), em.mul(x1, s));
  Val y1 = em.add(em.mul(x0, s), em.mul(x1, c));
  return em.reshape(em.concat({y0, y1}, 3), {T, n, C.hd});
}

// Mask [1, T*G, W] (i1, true = hidden): key j is visible from query row
// r = t*G + g iff j <= pos + t; in a block (GraphSpec::block, an image attended both
// ways) iff j <= pos + T - 1. Faults: causal_mask: iff j <= pos + T - 1 (the
// whole bucket, padding rows included); kv_off_by_one: iff j <= pos + t - 1 or
// j = 0; rewind_noop (kv_len != nullptr): also every j < kv_len. A sliding
// window (> 0) also hides j <= pos + t - window (reference: t0 = pos - window + 1).
Val attention_mask(Emitter& e, const Ctx& C, const Val& pos, const Val* kv_len, int64_t window) {
  const int64_t W = C.W, TG = C.T * C.G, off = C.F.kv_off_by_one ? 1 : 0;
  std::vector<int64_t> jcol(static_cast<size_t>(W)), trow(static_cast<size_t>(TG));
  for (int64_t j = 0; j < W; ++j) jcol[size_t(j)] = j + off;
  const bool whole = C.F.causal_mask || C.block;  // every row sees the call's last key
  for (int64_t r = 0; r < TG; ++r) trow[size_t(r)] = whole ? C.T - 1 : r / C.G;
  Val diff = e.sub(e.const_i32({1, 1, W}, jcol), e.const_i32({1, TG, 1}, trow));  // j - t
  Val masked = e.greater(diff, e.reshape(pos, {1, 1, 1}));
  if (C.F.kv_off_by_one) {  // key 0 stays visible: position 0 still attends to itself
    for (int64_t j = 0; j < W; ++j) jcol[size_t(j)] = j;
    masked = e.binary("tosa.logical_and", masked,
                      e.greater(e.const_i32({1, 1, W}, jcol), e.splat({1, 1, 1}, "i32", "0")));
  }
  if (kv_len) {  // hidden only if also j >= kv_len, i.e. j + 1 > kv_len
    for (int64_t j = 0; j < W; ++j) jcol[size_t(j)] = j + 1;
    masked = e.binary("tosa.logical_and", masked,
                      e.greater(e.const_i32({1, 1, W}, jcol), e.reshape(*kv_len, {1, 1, 1})));
  }
  if (window > 0) {  // hidden iff pos > j - t + window - 1
    for (int64_t j = 0; j < W; ++j) jcol[size_t(j)] = j + window - 1;
    for (int64_t r = 0; r < TG; ++r) trow[size_t(r)] = r / C.G;
    Val d2 = e.sub(e.const_i32({1, 1, W}, jcol), e.const_i32({1, TG, 1}, trow));
    masked = e.binary("tosa.logical_or", masked, e.greater(e.reshape(pos, {1, 1, 1}), d2));
  }
  return masked;
}

// Scatter indices of the T new entries: K scalars at (kvh*hd + i)*CAP + pos + t,
// input order (kvh, i, t); V rows of hd at kvh*CAP + pos + t, order (kvh, t).
// kv_write_next fault: slot pos + t + 1 (pidx [1, T] + 1), wrapped to slot 0
// past the capacity, so that the buggy write stays inside the cache.
std::pair<Val, Val> write_indices(Emitter& e, const Ctx& C, const Val& pos, const Val& pidx) {
  const int64_t T = C.T, CAP = C.CAP, kvd = C.kvd, KVH = C.KVH;
  if (C.F.kv_write_next) {
    Val w = e.add(pidx, e.splat({1, 1}, "i32", "1"));
    w = e.select(e.greater(w, e.splat({1, 1}, "i32", std::to_string(CAP - 1))),
                 e.sub(w, e.splat({1, 1}, "i32", std::to_string(CAP))), w);
    std::vector<int64_t> krow(static_cast<size_t>(kvd)), vrow(static_cast<size_t>(KVH));
    for (int64_t k = 0; k < kvd; ++k) krow[size_t(k)] = k * CAP;
    for (int64_t h = 0; h < KVH; ++h) vrow[size_t(h)] = h * CAP;
    return {e.reshape(e.add(e.const_i32({kvd, 1}, krow), w), {1, kvd * T}),
            e.reshape(e.add(e.const_i32({KVH, 1}, vrow), w), {1, KVH * T})};
  }
  std::vector<int64_t> kbase(static_cast<size_t>(kvd * T)), vbase(static_cast<size_t>(KVH * T));
  for (int64_t k = 0; k < kvd; ++k)
    for (int64_t t = 0; t < T; ++t) kbase[size_t(k * T + t)] = k * CAP + t;
  for (int64_t h = 0; h < KVH; ++h)
    for (int64_t t = 0; t < T; ++t) vbase[size_t(h * T + t)] = h * CAP + t;
  Val kidx = e.add(e.const_i32({1, kvd * T}, kbase), pos);
  Val vidx = e.add(e.const_i32({1, KVH * T}, vbase), pos);
  return {kidx, vidx};
}

// Softmax attention of q [T, H, hd] over kwin [KVH, hd, W] / vwin [KVH, W, hd]
// with mask [1, T*G, W]; returns [T, H*hd]. Queries are grouped by KV head,
// [KVH, T*G, hd], row r = t*G + g, head kvh*G + g (gqa_mapping fault: head
// g*KVH + kvh, i.e. query head h reads KV head h % KVH).
// sinks (gpt-oss, [1, H] or null): head h's logit joins its softmax's denominator and
// its maximum, attending to nothing (reference: ops on p_t = exp(s_t - m) /
// (sum_t exp(s_t - m) + exp(sink_h - m)), m = max(max_t s_t, sink_h)).
Val attend(Emitter& le, const Ctx& C, const Val& q, const Val& kwin, const Val& vwin,
           const Val& mask, const Val* sinks) {
  const int64_t T = C.T, KVH = C.KVH, G = C.G, hd = C.hd;
  const bool gqa = C.F.gqa_mapping;
  Val qg =
      gqa ? le.reshape(le.transpose(le.reshape(q, {T, G, KVH, hd}), {2, 0, 1, 3}), {KVH, T * G, hd})
          : le.reshape(le.transpose(le.reshape(q, {T, KVH, G, hd}), {1, 0, 2, 3}),
                       {KVH, T * G, hd});
  const double model_scale = C.M.attn_scale > 0 ? C.M.attn_scale : 1.0 / std::sqrt(double(hd));
  const double scale = C.F.attention_scale ? 1.0 / double(hd) : model_scale;
  Val sc = le.mul(le.matmul(qg, kwin), le.splat({1, 1, 1}, "f32", fmt_float(scale)));
  sc = le.select(mask, le.splat({1, 1, 1}, "f32", "-1.0e+30"), sc);
  Val sink;  // [KVH, T*G, 1]: row t*G + g holds the sink of its head
  if (sinks) {
    sink = gqa ? le.transpose(le.reshape(*sinks, {1, G, KVH}), {2, 0, 1})
               : le.reshape(*sinks, {KVH, 1, G});
    sink = le.reshape(le.tile(sink, {1, T, 1}), {KVH, T * G, 1});
  }
  Val ex, mx;
  if (C.F.softmax_no_max) {  // fp32 exp(s) as is: inf above ~88.7, then inf/inf = NaN
    ex = le.unary("tosa.exp", sc);
  } else {
    mx = le.reduce("tosa.reduce_max", sc, 2);
    if (sinks) mx = le.binary("tosa.maximum", mx, sink);
    ex = le.unary("tosa.exp", le.sub(sc, mx));
  }
  Val sum = le.reduce("tosa.reduce_sum", ex, 2);
  if (sinks) sum = le.add(sum, le.unary("tosa.exp", C.F.softmax_no_max ? sink : le.sub(sink, mx)));
  Val o = le.mul(le.matmul(ex, vwin), le.unary("tosa.reciprocal", sum));  // [KVH, T*G, hd]
  o = le.transpose(le.reshape(o, {KVH, T, G, hd}),
                   gqa ? std::vector<int>{1, 2, 0, 3} : std::vector<int>{1, 0, 2, 3});
  return le.reshape(o, {T, C.qd});
}

// Values of main that every layer takes: x (shape only), RoPE rows, mask,
// indices, the tapped row. A layer gets the RoPE rows of its table and the mask
// of its sliding window: different values, the same function.
struct LayerInputs {
  Val x, c, s, masked, kidx, vidx, tap_row;
};

// Calls norm(name) for attn_norm and ffn_norm and mat(k, shape) for every layer matrix of
// the model, in the order of a layer's weight parameters.
template <typename Norm, typename Mat>
void for_layer_weights(const ModelDims& D, const Norm& norm, const Mat& mat) {
  norm("attn_norm");
  for (int k = 0; k < kLayerMatrices; ++k) {
    if (k == kFfnGate) norm("ffn_norm");
    const MatrixShape s = layer_matrix_shape(D, k);
    if (s.count > 0) mat(k, s);
  }
}

LayerParams layer_params(Fn& f, const Ctx& C, const MatrixFormat* fmt) {
  LayerParams p;
  const int64_t sl = C.F.reduction_slices;
  for_layer_weights(
      C.M,
      [&](const char* n) {
        p.vec[n] = f.param(n, {1, C.d}, "f32");
      },
      [&](int k, const MatrixShape& s) {
        p.mats[k] = matrix(f, layer_matrix_name(C.M, k), s.in, s.out, fmt[k], sl, s.count);
      });
  for (const auto& [name, n] : layer_vectors(C.M)) p.vec[name] = f.param(name, {1, n}, "f32");
  p.kc = f.param("k_cache", {1, C.kvd * C.CAP, 1}, "f32");
  p.vc = f.param("v_cache", {1, C.KVH * C.CAP, C.hd}, "f32");
  return p;
}

// y = x . M (+ bias when the model has biases and `bias` names one).
Val project(Emitter& le, const Ctx& C, const LayerParams& p, const Val& x, int k,
            const char* bias) {
  Val y = linear(le, C, x, p.mats[k]);
  return C.M.qkv_bias && bias ? le.add(y, p.vec.at(bias)) : y;
}

// RMSNorm of each head of x [T, n*hd] with w [1, hd], as [T, n, hd].
Val head_norm(Emitter& le, const Ctx& C, const Val& x, int64_t n, const Val& w) {
  return le.reshape(rms_norm(le, C, le.reshape(x, {C.T * n, C.hd}), w), {C.T, n, C.hd});
}

// Row tap_row of x [T, d] as [1, 1, d].
Val tap_of(Emitter& e, const Ctx& C, const Val& x, const Val& tap_row) {
  return e.gather(e.reshape(x, {1, C.T, C.d}), tap_row);
}

// One outlined layer function for the weight formats fmt[7]:
// (x, cos, sin, masked, kidx, vidx, tap_row, attn_norm, q, k, v, o, ffn_norm,
// gate, up, down, [layer_vectors], k_cache, v_cache) -> (x', k_cache', v_cache',
// taps [1, 3, d]: attention output, FFN output, residual at row tap_row).
std::string layer_function(const Ctx& C, const std::string& name, const MatrixFormat* fmt,
                           const LayerInputs& in) {
  const int64_t T = C.T, H = C.H, KVH = C.KVH, hd = C.hd, CAP = C.CAP, W = C.W, kvd = C.kvd;
  Fn f;
  Emitter& le = f.e;
  Val lx = f.param("x", in.x.shape, "f32");
  Val lc = f.param("cos", in.c.shape, "f32");
  Val ls = f.param("sin", in.s.shape, "f32");
  Val lmask = f.param("masked", in.masked.shape, "i1");
  Val lkidx = f.param("kidx", in.kidx.shape, "i32");
  Val lvidx = f.param("vidx", in.vidx.shape, "i32");
  Val ltap = f.param("tap_row", in.tap_row.shape, "i32");
  LayerParams p = layer_params(f, C, fmt);
  // ---- attention ----
  Val h = rms_norm(le, C, lx, p.vec.at("attn_norm"));
  Val q = project(le, C, p, h, 0, "attn_q.bias");
  Val k = project(le, C, p, h, 1, "attn_k.bias");
  Val v = le.reshape(project(le, C, p, h, 2, "attn_v.bias"), {T, KVH, hd});
  q = C.M.qk_norm ? head_norm(le, C, q, H, p.vec.at("attn_q_norm")) : le.reshape(q, {T, H, hd});
  k = C.M.qk_norm ? head_norm(le, C, k, KVH, p.vec.at("attn_k_norm")) : le.reshape(k, {T, KVH, hd});
  q = rope(le, C, q, lc, ls);
  k = rope(le, C, k, lc, ls);
  // KV writes at positions pos..pos+T-1 (in place after bufferization).
  Val kc = le.scatter(p.kc, lkidx, le.reshape(le.transpose(k, {1, 2, 0}), {1, kvd * T, 1}));
  Val vc = le.scatter(p.vc, lvidx, le.reshape(le.transpose(v, {1, 0, 2}), {1, KVH * T, hd}));
  // Key window: Kt [KVH, hd, W], V [KVH, W, hd].
  Val kwin = le.slice(le.reshape(kc, {KVH, hd, CAP}), {0, 0, 0}, {KVH, hd, W});
  Val vwin = le.slice(le.reshape(vc, {KVH, CAP, hd}), {0, 0, 0}, {KVH, W, hd});
  const bool sinks_on = C.M.attn_sinks && !C.F.attention_sinks_ignored;
  const Val* sinks = sinks_on ? &p.vec.at("attn_sinks") : nullptr;
  Val a = linear(le, C, attend(le, C, q, kwin, vwin, lmask, sinks), p.mats[kAttnOutput]);
  if (C.M.attn_out_bias) a = le.add(a, p.vec.at("attn_output.bias"));
  if (C.M.post_norms) a = rms_norm(le, C, a, p.vec.at("post_attention_norm"));
  Val x1 = le.add(lx, a);
  // ---- gated FFN (SwiGLU or GeGLU) or mixture of experts ----
  Val h2 = rms_norm(le, C, x1, p.vec.at("ffn_norm"));
  Val ff = C.M.n_expert > 0 ? moe_ffn(le, C, p, h2) : gated_ffn(le, C, h2, p.mats + kFfnGate);
  if (C.M.post_norms) ff = rms_norm(le, C, ff, p.vec.at("post_ffw_norm"));
  Val x2 = le.add(x1, ff);
  Val taps =
      le.concat({tap_of(le, C, a, ltap), tap_of(le, C, ff, ltap), tap_of(le, C, x2, ltap)}, 1);
  std::vector<Val> rets{x2, kc, vc, taps};
  std::ostringstream fn;
  fn << "  func.func private @" << name << "(" << signature(f.params) << ") -> (" << types(rets)
     << ") {\n"
     << le.body.str() << "    return " << names(rets) << " : " << types(rets) << "\n  }\n";
  return fn.str();
}

Ctx make_ctx(const ModelDims& D, const GraphSpec& S) {
  Ctx C{S.T,      S.W,      S.capacity,  D.n_layer,  D.n_embd,
        D.n_ff,   D.n_head, D.n_head_kv, D.head_dim, D.n_vocab,
        0,        0,        0,           0,          double(D.rms_eps) * S.faults.rms_eps_scale,
        S.faults, D,        S.block};
  C.G = C.H / C.KVH;
  C.qd = C.H * C.hd;
  C.kvd = C.KVH * C.hd;
  C.half = D.rot() / 2;
  if (C.W > C.CAP || C.W <= 0 || C.T <= 0 || C.T > C.W)
    throw std::logic_error("build_step_graph: bad spec");
  if (D.rot() % 2 || D.rot() > D.head_dim || D.n_rope_tables < 1)
    throw std::logic_error("build_step_graph: bad n_rot or RoPE tables");
  if (C.F.reduction_slices < 1) throw std::logic_error("build_step_graph: reduction_slices < 1");
  if (S.block && !S.embeddings) throw std::logic_error("build_step_graph: a block of token ids");
  return C;
}

// @step being built: its emitter and parameters, and the exported argument list.
struct MainFn {
  Fn f;
  BuiltGraph* out;
  Val arg(const std::string& name, const Shape& s, const std::string& elem) {
    out->args.push_back(ArgInfo{name, s, elem});
    return f.param(name, s, elem);
  }
};

MatrixFormat layer_format(const GraphSpec& S, int64_t l, int k) {
  return S.mode == WeightMode::Quantized && k != kFfnGateInp
             ? S.layer_formats.at(size_t(l * kLayerMatrices + k))
             : MatrixFormat::F32;
}

// x * embd_scale (Gemma: sqrt(n_embd)); x itself when the scale is 1.
Val scale_embedding(Emitter& e, const Ctx& C, const Val& x) {
  if (C.M.embd_scale == 1.0) return x;
  return e.mul(x, e.splat({1, 1}, "f32", fmt_float(C.M.embd_scale)));
}

// Token embeddings [T, d] times embd_scale (Q8_0 rows gathered and dequantized
// on the 4-bit path).
Val embed(MainFn& m, const Ctx& C, const GraphSpec& S, const Val& tokens) {
  Emitter& e = m.f.e;
  const int64_t T = C.T, V = C.V, d = C.d;
  if (S.mode == WeightMode::Quantized && S.embd_format == MatrixFormat::Q8_0) {
    const int64_t nb = d / 32;
    Val eq = m.arg("token_embd.rows.qs", {1, V, d}, "i8");
    Val ed = m.arg("token_embd.rows.d", {1, V, nb}, "f16");
    Val q = e.cast(e.reshape(e.gather(eq, tokens), {T, nb, 32}), "f32");
    Val sc = e.reshape(e.gather(ed, tokens), {T, nb, 1});
    return scale_embedding(e, C, e.reshape(e.mul(q, e.cast(sc, "f32")), {T, d}));
  }
  Val emb = m.arg("token_embd", {1, V, d}, "f32");
  return scale_embedding(e, C, e.reshape(e.gather(emb, tokens), {T, d}));
}

// Weight and cache arguments of @step: every layer's weights, then the head
// (dequantized in main, if quantized), then the caches.
struct MainWeights {
  std::vector<std::vector<Val>> layers;
  Val out_norm;
  std::vector<Val> lm_head, kcs, vcs;
};

MainWeights declare_weights(MainFn& m, const Ctx& C, const GraphSpec& S) {
  const int64_t L = C.L, d = C.d, kvd = C.kvd;
  MainWeights w;
  w.layers.resize(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto& lw = w.layers[size_t(l)];
    for_layer_weights(
        C.M,
        [&](const char* n) {
          lw.push_back(m.arg(p + n, {1, d}, "f32"));
        },
        [&](int k, const MatrixShape& s) {
          for (const MatrixPart& part : matrix_parts(s.in, s.out, layer_format(S, l, k), s.count))
            lw.push_back(m.arg(p + layer_matrix_name(C.M, k) + part.suffix, part.shape, part.elem));
        });
    for (const auto& [name, n] : layer_vectors(C.M)) lw.push_back(m.arg(p + name, {1, n}, "f32"));
  }
  w.out_norm = m.arg("output_norm", {1, d}, "f32");
  const MatrixFormat hf =
      S.mode == WeightMode::Quantized ? S.head_format.value_or(S.embd_format) : MatrixFormat::F32;
  const size_t before = m.f.params.size();
  w.lm_head = matrix(m.f, "lm_head", d, C.V, hf, C.F.reduction_slices);
  for (size_t i = before; i < m.f.params.size(); ++i) {
    const Val& v = m.f.params[i];
    std::string nm = "lm_head";
    for (const MatrixPart& part : matrix_parts(d, C.V, hf))
      if ("%" + ident("lm_head" + part.suffix) == v.name) nm = "lm_head" + part.suffix;
    m.out->args.push_back(ArgInfo{nm, v.shape, v.elem});
  }
  for (int64_t l = 0; l < L; ++l)
    w.kcs.push_back(m.arg("k_cache." + std::to_string(l), {1, kvd * C.CAP, 1}, "f32"));
  for (int64_t l = 0; l < L; ++l)
    w.vcs.push_back(m.arg("v_cache." + std::to_string(l), {1, C.KVH * C.CAP, C.hd}, "f32"));
  return w;
}

// Per-layer inputs of main: the RoPE rows of each table, the mask of each
// sliding window; the rest is shared.
struct MainInputs {
  LayerInputs shared;
  std::vector<Val> cos, sin;    // by RoPE table
  std::map<int64_t, Val> mask;  // by sliding window (0: none)
};

int64_t layer_table(const Ctx& C, int64_t l) {
  return C.M.layer_rope.empty() ? 0 : C.M.layer_rope.at(size_t(l));
}
int64_t layer_window(const Ctx& C, int64_t l) {
  return C.M.layer_window.empty() ? 0 : C.M.layer_window.at(size_t(l));
}

// Emits one call of `fn` for layer l; updates x and the layer's caches and
// returns the layer's taps [1, 3, d].
Val call_layer(MainFn& m, const Ctx& C, const MainInputs& mi, MainWeights& w, int64_t l,
               const std::string& fn, Val& x) {
  Emitter& e = m.f.e;
  const LayerInputs& li = mi.shared;
  const size_t tab = size_t(layer_table(C, l));
  std::vector<Val> ops{x,       mi.cos.at(tab), mi.sin.at(tab), mi.mask.at(layer_window(C, l)),
                       li.kidx, li.vidx,        li.tap_row};
  for (const Val& v : w.layers[size_t(l)]) ops.push_back(v);
  Val& kc = w.kcs[size_t(l)];
  Val& vc = w.vcs[size_t(l)];
  ops.push_back(kc);
  ops.push_back(vc);
  Val r = e.fresh({}, "");
  std::vector<Val> rets{Val{r.name + "#0", x.shape, "f32"}, Val{r.name + "#1", kc.shape, "f32"},
                        Val{r.name + "#2", vc.shape, "f32"},
                        Val{r.name + "#3", {1, 3, C.d}, "f32"}};
  e.body << "    " << r.name << ":4 = func.call @" << fn << "(" << names(ops) << ") : ("
         << types(ops) << ") -> (" << types(rets) << ")\n";
  x = rets[0];
  kc = rets[1];
  vc = rets[2];
  return rets[3];
}

// Calls the layers in order (one outlined function per weight-format signature,
// appended to fns: compiled once, called n_layer times, so compile time does not
// grow with depth); x becomes the residual stream, w's caches the calls'
// results. Returns the layer taps [1, 3L, d]. last_layer_skipped fault: the
// last layer is not called (its taps: zero outputs, the residual unchanged).
Val call_layers(MainFn& m, const Ctx& C, const GraphSpec& S, const MainInputs& mi, MainWeights& w,
                std::ostringstream& fns, Val& x) {
  Emitter& e = m.f.e;
  std::map<std::string, std::string> layer_fns;  // format signature -> function name
  std::vector<Val> taps;
  const int64_t n_run = C.F.last_layer_skipped ? C.L - 1 : C.L;
  for (int64_t l = 0; l < n_run; ++l) {
    MatrixFormat fmt[kLayerMatrices];
    std::string key;
    for (int k = 0; k < kLayerMatrices; ++k) {
      fmt[k] = layer_format(S, l, k);
      if (layer_matrix_shape(C.M, k).count > 0) key += std::to_string(int(fmt[k]));
    }
    auto [it, fresh] = layer_fns.emplace(key, "layer_" + std::to_string(layer_fns.size()));
    if (fresh) fns << layer_function(C, it->second, fmt, mi.shared);
    taps.push_back(call_layer(m, C, mi, w, l, it->second, x));
  }
  for (int64_t l = n_run; l < C.L; ++l)
    taps.push_back(
        e.concat({e.splat({1, 2, C.d}, "f32", "0.0"), tap_of(e, C, x, mi.shared.tap_row)}, 1));
  return taps.size() == 1 ? taps[0] : e.concat(taps, 1);
}

// The results of @step (logits, updated caches, [argmax], taps) and the module text.
void finish_module(MainFn& m, const Ctx& C, const GraphSpec& S, const Val& logits,
                   const MainWeights& w, const Val& taps, const std::string& fns,
                   const std::string& func_name) {
  Emitter& e = m.f.e;
  BuiltGraph& out = *m.out;
  std::vector<Val> results{logits};
  out.results.push_back(ArgInfo{"logits", logits.shape, logits.elem});
  for (int64_t l = 0; l < C.L; ++l) {
    results.push_back(w.kcs[size_t(l)]);
    out.results.push_back(ArgInfo{"k_cache." + std::to_string(l), w.kcs[size_t(l)].shape, "f32"});
  }
  for (int64_t l = 0; l < C.L; ++l) {
    results.push_back(w.vcs[size_t(l)]);
    out.results.push_back(ArgInfo{"v_cache." + std::to_string(l), w.vcs[size_t(l)].shape, "f32"});
  }
  if (S.argmax) {
    // nan_mode IGNORE: strict ogt against the running maximum, so the lowest id
    // among equal maxima wins and a NaN never replaces it (the default,
    // PROPAGATE, makes the first NaN win). See prefill_greedy in engine.cpp.
    Val am = e.emit("tosa.argmax", {logits}, {C.T}, "i32",
                    "{axis = 1 : i32, nan_mode = #tosa.nan_mode<IGNORE>}");
    results.push_back(am);
    out.results.push_back(ArgInfo{"argmax", am.shape, am.elem});
  }
  results.push_back(taps);
  out.results.push_back(ArgInfo{"taps", taps.shape, taps.elem});
  std::ostringstream mod;
  mod << "module {\n" << fns;
  mod << "  func.func @" << func_name << "(" << signature(m.f.params) << ") -> (" << types(results)
      << ") attributes {llvm.emit_c_interface} {\n";
  mod << e.body.str();
  mod << "    return " << names(results) << " : " << types(results) << "\n  }\n}\n";
  out.mlir = mod.str();
}

// The name of RoPE table k's inputs: rope_cos / rope_sin, then rope_cos.1, ...
std::string rope_arg(const char* base, int32_t k) {
  return k == 0 ? std::string(base) : std::string(base) + "." + std::to_string(k);
}

// RoPE rows of every table at pos + t, and the mask of every sliding window.
void position_inputs(MainFn& m, const Ctx& C, const Val& pidx, const Val& pos, const Val* kv_len,
                     MainInputs& mi) {
  Emitter& e = m.f.e;
  const int64_t T = C.T, half = C.half;
  std::vector<Val> tables;
  for (int32_t k = 0; k < C.M.n_rope_tables; ++k) {
    tables.push_back(m.arg(rope_arg("rope_cos", k), {1, C.CAP, half}, "f32"));
    tables.push_back(m.arg(rope_arg("rope_sin", k), {1, C.CAP, half}, "f32"));
  }
  for (int32_t k = 0; k < C.M.n_rope_tables; ++k) {
    mi.cos.push_back(e.reshape(e.gather(tables[size_t(2 * k)], pidx), {T, 1, half, 1}));
    mi.sin.push_back(e.reshape(e.gather(tables[size_t(2 * k + 1)], pidx), {T, 1, half, 1}));
  }
  for (int64_t l = 0; l < C.L; ++l) {
    const int64_t win = layer_window(C, l);
    if (!mi.mask.count(win)) mi.mask[win] = attention_mask(e, C, pos, kv_len, win);
  }
  if (!mi.mask.count(0)) mi.mask[0] = attention_mask(e, C, pos, kv_len, 0);
  mi.shared.c = mi.cos[0];
  mi.shared.s = mi.sin[0];
  mi.shared.masked = mi.mask[0];
}

// logits [T, V] = cap * tanh(logits / cap) when the model soft-caps them.
Val softcap(Emitter& e, const Ctx& C, const Val& logits) {
  const double cap = C.M.final_logit_softcap;
  if (cap == 0.0) return logits;
  Val t = e.unary("tosa.tanh", e.mul(logits, e.splat({1, 1}, "f32", fmt_float(1.0 / cap))));
  return e.mul(t, e.splat({1, 1}, "f32", fmt_float(cap)));
}

}  // namespace

std::vector<VectorArg> layer_vectors(const ModelDims& D) {
  const int64_t hd = D.head_dim, qd = int64_t(D.n_head) * hd, kvd = int64_t(D.n_head_kv) * hd;
  std::vector<VectorArg> v;
  if (D.qkv_bias)
    v.insert(v.end(), {{"attn_q.bias", qd}, {"attn_k.bias", kvd}, {"attn_v.bias", kvd}});
  if (D.qk_norm) v.insert(v.end(), {{"attn_q_norm", hd}, {"attn_k_norm", hd}});
  if (D.post_norms)
    v.insert(v.end(), {{"post_attention_norm", D.n_embd}, {"post_ffw_norm", D.n_embd}});
  if (D.n_ff_shexp > 0) v.push_back({"ffn_gate_inp_shexp", D.n_embd});
  if (D.attn_out_bias) v.push_back({"attn_output.bias", D.n_embd});
  if (D.attn_sinks) v.push_back({"attn_sinks", D.n_head});
  if (D.moe_biases) {
    const int64_t E = D.n_expert;
    v.insert(v.end(), {{"ffn_gate_inp.bias", E},
                       {"ffn_gate_exps.bias", E * D.n_ff_exp},
                       {"ffn_up_exps.bias", E * D.n_ff_exp},
                       {"ffn_down_exps.bias", E * D.n_embd}});
  }
  return v;
}

MatrixShape layer_matrix_shape(const ModelDims& D, int k) {
  const int64_t d = D.n_embd, qd = int64_t(D.n_head) * D.head_dim;
  const int64_t kvd = int64_t(D.n_head_kv) * D.head_dim, E = D.n_expert;
  const int64_t ff = E > 0 ? D.n_ff_exp : D.n_ff, n = E > 0 ? E : 1, sh = D.n_ff_shexp;
  switch (k) {
    case kAttnQ:
      return {d, qd, 1};
    case kAttnK:
    case kAttnV:
      return {d, kvd, 1};
    case kAttnOutput:
      return {qd, d, 1};
    case kFfnGate:
    case kFfnUp:
      return {d, ff, n};
    case kFfnDown:
      return {ff, d, n};
    case kFfnGateInp:
      return {d, E, E > 0 ? 1 : 0};
    case kFfnGateShexp:
    case kFfnUpShexp:
      return {d, sh, sh > 0 ? 1 : 0};
    case kFfnDownShexp:
      return {sh, d, sh > 0 ? 1 : 0};
    default:
      throw std::logic_error("layer_matrix_shape: bad matrix");
  }
}

std::string layer_matrix_name(const ModelDims& D, int k) {
  static const char* const names[kLayerMatrices] = {
      "attn_q",   "attn_k",       "attn_v",         "attn_output",  "ffn_gate",      "ffn_up",
      "ffn_down", "ffn_gate_inp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"};
  if (k < 0 || k >= kLayerMatrices) throw std::logic_error("layer_matrix_name: bad matrix");
  const bool experts = D.n_expert > 0 && k >= kFfnGate && k <= kFfnDown;
  return std::string(names[k]) + (experts ? "_exps" : "");
}

BuiltGraph build_step_graph(const ModelDims& D, const GraphSpec& S, const std::string& func_name) {
  const Ctx C = make_ctx(D, S);
  const int64_t T = C.T;
  BuiltGraph out;
  MainFn m{Fn{}, &out};
  Emitter& e = m.f.e;

  Val tokens = S.embeddings ? m.arg("embd", {1, T, C.d}, "f32") : m.arg("tokens", {1, T}, "i32");
  Val pos = m.arg("pos", {1, 1}, "i32");
  Val kv_len;  // rewind_noop fault only
  if (C.F.kv_len_input) kv_len = m.arg("kv_len", {1, 1}, "i32");
  MainInputs mi;
  mi.shared.tap_row = m.arg("tap_row", {1, 1}, "i32");
  std::vector<int64_t> iota_t(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) iota_t[size_t(t)] = t;
  Val pidx = e.add(e.const_i32({1, T}, iota_t), pos);  // [1, T] positions
  position_inputs(m, C, pidx, pos, C.F.kv_len_input ? &kv_len : nullptr, mi);
  mi.shared.x = S.embeddings ? e.reshape(tokens, {T, C.d}) : embed(m, C, S, tokens);
  std::tie(mi.shared.kidx, mi.shared.vidx) = write_indices(e, C, pos, pidx);

  MainWeights w = declare_weights(m, C, S);
  std::ostringstream fns;
  Val x = mi.shared.x;
  Val taps = call_layers(m, C, S, mi, w, fns, x);
  Val xn = rms_norm(e, C, x, w.out_norm);
  Val logits = softcap(e, C, linear(e, C, xn, w.lm_head));  // [T, V]
  finish_module(m, C, S, logits, w, taps, fns.str(), func_name);
  return out;
}

}  // namespace touchstone::static_graph
