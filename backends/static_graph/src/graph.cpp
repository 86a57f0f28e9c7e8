// graph.cpp - the Llama step graph as TOSA 1.0 text (see graph.h).
#include "graph.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

namespace touchstone::static_graph {
namespace {

using Shape = std::vector<int64_t>;

struct Val {
  std::string name;
  Shape shape;
  std::string elem;
};

std::string tensor_type(const Shape& s, const std::string& e) {
  std::string t = "tensor<";
  for (int64_t d : s) t += std::to_string(d) + "x";
  return t + e + ">";
}
std::string tensor_type(const Val& v) { return tensor_type(v.shape, v.elem); }

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

class Emitter {
 public:
  std::ostringstream body;

  Val fresh(Shape s, std::string e) {
    return Val{"%v" + std::to_string(n_++), std::move(s), std::move(e)};
  }

  Val emit(const std::string& op, const std::vector<Val>& ins, Shape out, const std::string& elem,
           const std::string& attrs = "") {
    // Generic op syntax: stable across MLIR versions (IREE's TOSA printer differs from MLIR 22's).
    Val r = fresh(std::move(out), elem);
    body << "    " << r.name << " = \"" << op << "\"(";
    for (size_t i = 0; i < ins.size(); ++i) body << (i ? ", " : "") << ins[i].name;
    body << ")";
    if (!attrs.empty()) body << " <" << attrs << ">";
    body << " : (";
    for (size_t i = 0; i < ins.size(); ++i) body << (i ? ", " : "") << type_of(ins[i]);
    body << ") -> " << tensor_type(r) << "\n";
    return r;
  }

  static std::string type_of(const Val& v) {
    if (v.elem == "shape") return "!tosa.shape<" + std::to_string(v.shape[0]) + ">";
    return tensor_type(v);
  }

  Val shape_const(const Shape& s) {
    Val r = fresh(Shape{int64_t(s.size())}, "shape");
    body << "    " << r.name << " = \"tosa.const_shape\"() <{values = dense<[";
    for (size_t i = 0; i < s.size(); ++i) body << (i ? ", " : "") << s[i];
    body << "]> : tensor<" << s.size() << "xindex>}> : () -> !tosa.shape<" << s.size() << ">\n";
    return r;
  }

  // Constant tensor with explicit values (ints) or a splat.
  Val const_i32(const Shape& s, const std::vector<int64_t>& values) {
    if (values.size() > 1 && s.size() != 1)
      return reshape(const_i32({int64_t(values.size())}, values), s);
    Val r = fresh(s, "i32");
    body << "    " << r.name << " = \"tosa.const\"() <{values = dense<";
    if (values.size() == 1) {
      body << values[0];
    } else {
      body << "[";
      for (size_t i = 0; i < values.size(); ++i) body << (i ? ", " : "") << values[i];
      body << "]";
    }
    body << "> : " << tensor_type(r) << "}> : () -> " << tensor_type(r) << "\n";
    return r;
  }
  Val splat(const Shape& s, const std::string& elem, const std::string& value) {
    Val r = fresh(s, elem);
    body << "    " << r.name << " = \"tosa.const\"() <{values = dense<" << value
         << "> : " << tensor_type(r) << "}> : () -> " << tensor_type(r) << "\n";
    return r;
  }

  Val reshape(const Val& x, const Shape& s) {
    if (numel(s) != numel(x.shape)) throw std::logic_error("reshape: element count mismatch");
    if (s == x.shape) return x;
    Val sh = shape_const(s);
    return emit("tosa.reshape", {x, sh}, s, x.elem);
  }
  Val transpose(const Val& x, const std::vector<int>& perm) {
    Shape s;
    std::string p;
    for (size_t i = 0; i < perm.size(); ++i) {
      s.push_back(x.shape[size_t(perm[i])]);
      p += (i ? ", " : "") + std::to_string(perm[i]);
    }
    return emit("tosa.transpose", {x}, s, x.elem, "{perms = array<i32: " + p + ">}");
  }
  Val slice(const Val& x, const Shape& start, const Shape& size) {
    Val a = shape_const(start), b = shape_const(size);
    return emit("tosa.slice", {x, a, b}, size, x.elem);
  }
  Val matmul(const Val& a, const Val& b) {
    // a [N,H,C] . b [N,C,W] -> [N,H,W]
    if (a.shape.size() != 3 || b.shape.size() != 3 || a.shape[2] != b.shape[1] ||
        a.shape[0] != b.shape[0]) {
      throw std::logic_error("matmul: shape mismatch");
    }
    if (zp_.name.empty()) zp_ = splat({1}, "f32", "0.0");
    return emit("tosa.matmul", {a, b, zp_, zp_}, {a.shape[0], a.shape[1], b.shape[2]}, "f32");
  }
  Shape bcast(const Val& a, const Val& b) {
    if (a.shape.size() != b.shape.size()) throw std::logic_error("broadcast: rank mismatch");
    Shape s;
    for (size_t i = 0; i < a.shape.size(); ++i) {
      if (a.shape[i] != b.shape[i] && a.shape[i] != 1 && b.shape[i] != 1) {
        throw std::logic_error("broadcast: incompatible dims");
      }
      s.push_back(std::max(a.shape[i], b.shape[i]));
    }
    return s;
  }
  Val binary(const std::string& op, const Val& a, const Val& b) {
    return emit(op, {a, b}, bcast(a, b), a.elem);
  }
  Val add(const Val& a, const Val& b) { return binary("tosa.add", a, b); }
  Val sub(const Val& a, const Val& b) { return binary("tosa.sub", a, b); }
  Val mul(const Val& a, const Val& b) {
    if (shift_.name.empty()) shift_ = splat({1}, "i8", "0");
    return emit("tosa.mul", {a, b, shift_}, bcast(a, b), a.elem);
  }
  Val greater(const Val& a, const Val& b) {
    return emit("tosa.greater", {a, b}, bcast(a, b), "i1");
  }
  Val select(const Val& p, const Val& a, const Val& b) {
    Val t{"", bcast(p, a), a.elem};
    return emit("tosa.select", {p, a, b}, bcast(t, b), a.elem);
  }
  Val unary(const std::string& op, const Val& x) { return emit(op, {x}, x.shape, x.elem); }
  Val cast(const Val& x, const std::string& elem) { return emit("tosa.cast", {x}, x.shape, elem); }
  Val reduce(const std::string& op, const Val& x, int axis) {
    Shape s = x.shape;
    s[size_t(axis)] = 1;
    return emit(op, {x}, s, x.elem, "{axis = " + std::to_string(axis) + " : i32}");
  }
  Val concat(const std::vector<Val>& xs, int axis) {
    Shape s = xs[0].shape;
    s[size_t(axis)] = 0;
    for (const Val& x : xs) s[size_t(axis)] += x.shape[size_t(axis)];
    return emit("tosa.concat", xs, s, xs[0].elem, "{axis = " + std::to_string(axis) + " : i32}");
  }
  Val gather(const Val& values, const Val& idx) {
    return emit("tosa.gather", {values, idx}, {values.shape[0], idx.shape[1], values.shape[2]},
                values.elem);
  }
  Val scatter(const Val& values_in, const Val& idx, const Val& input) {
    return emit("tosa.scatter", {values_in, idx, input}, values_in.shape, values_in.elem);
  }

 private:
  int n_ = 0;
  Val zp_, shift_;
};

std::string fmt_float(double v) {
  std::ostringstream o;
  o.precision(9);
  o << std::scientific << v;
  return o.str();
}

}  // namespace

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

// Graph arguments of one weight matrix used as y[T, out] = x[T, in] . M[in, out].
std::vector<MatrixPart> matrix_parts(int64_t in, int64_t outd, MatrixFormat f) {
  const int64_t nb = in / 32;
  switch (f) {
    case MatrixFormat::F32:
      return {{"", {1, in, outd}, "f32"}};
    case MatrixFormat::Q4_0:
      return {{".qs", {nb, 16, outd}, "i8"}, {".d", {nb, 1, outd}, "f16"}};
    case MatrixFormat::Q4_1:
      return {{".qs", {nb, 16, outd}, "i8"},
              {".d", {nb, 1, outd}, "f16"},
              {".m", {nb, 1, outd}, "f16"}};
    case MatrixFormat::Q8_0:
      return {{".qs", {nb, 32, outd}, "i8"}, {".d", {nb, 1, outd}, "f16"}};
  }
  throw std::logic_error("matrix_parts: bad format");
}

// Declares the matrix parameters in fn and returns the fp32 [1, in, out] operand
// (dequantized in the graph for the block formats).
Val matrix(Fn& fn, const std::string& name, int64_t in, int64_t outd, MatrixFormat f) {
  std::vector<Val> p;
  for (const MatrixPart& part : matrix_parts(in, outd, f))
    p.push_back(fn.param(name + part.suffix, part.shape, part.elem));
  Emitter& e = fn.e;
  switch (f) {
    case MatrixFormat::F32:
      return p[0];
    case MatrixFormat::Q4_0:
    case MatrixFormat::Q4_1: {
      // Element j of block b is nibble h = j / 16 of byte j % 16 (low nibbles are
      // elements 0-15, ggml's order): shift the bytes, broadcast along h, by
      // [0, 4] and mask -> [nb][2][16][out]. Only broadcasting elementwise ops
      // and one reshape (no concat), so that the schedule can fuse the whole
      // dequantization into the matmul's tiles (compiler.cpp).
      const int64_t nb = in / 32;
      Val qs = e.reshape(p[0], {nb, 1, 16, outd});
      Val sh = e.reshape(e.const_i32({2}, {0, 4}), {1, 2, 1, 1});
      Val nib =
          e.binary("tosa.bitwise_and", e.binary("tosa.logical_right_shift", qs, e.cast(sh, "i8")),
                   e.splat({1, 1, 1, 1}, "i8", "15"));
      Val q = e.cast(nib, "f32");  // [nb][2][16][out]
      Val d = e.cast(e.reshape(p[1], {nb, 1, 1, outd}), "f32");
      Val w;
      if (f == MatrixFormat::Q4_1) {
        w = e.add(e.mul(q, d), e.cast(e.reshape(p[2], {nb, 1, 1, outd}), "f32"));  // q*d + m
      } else {
        w = e.mul(e.sub(q, e.splat({1, 1, 1, 1}, "f32", "8.0")), d);  // (q-8)*d (ggml order)
      }
      return e.reshape(w, {1, in, outd});
    }
    case MatrixFormat::Q8_0:
      return e.reshape(e.mul(e.cast(p[0], "f32"), e.cast(p[1], "f32")), {1, in, outd});
  }
  throw std::logic_error("matrix: bad format");
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

}  // namespace

BuiltGraph build_step_graph(const ModelDims& D, const GraphSpec& S, const std::string& func_name) {
  const int64_t T = S.T, W = S.W, CAP = S.capacity, L = D.n_layer, d = D.n_embd, ff = D.n_ff;
  const int64_t H = D.n_head, KVH = D.n_head_kv, hd = D.head_dim, V = D.n_vocab, G = H / KVH;
  const int64_t qd = H * hd, kvd = KVH * hd, half = hd / 2;
  if (W > CAP || W <= 0 || T <= 0 || T > W) throw std::logic_error("build_step_graph: bad spec");
  const bool quant = S.mode == WeightMode::Quantized;

  BuiltGraph out;
  Fn mainf;
  Emitter& e = mainf.e;
  auto arg = [&](const std::string& name, const Shape& s, const std::string& elem) {
    out.args.push_back(ArgInfo{name, s, elem});
    return mainf.param(name, s, elem);
  };

  auto linear = [&](Emitter& em, const Val& x, const Val& m) {  // x [T, in]
    Val y = em.matmul(em.reshape(x, {1, T, x.shape[1]}), m);
    return em.reshape(y, {T, m.shape[2]});
  };
  auto rms_norm = [&](Emitter& em, const Val& x, const Val& w) {  // x [T, d], w [1, d]
    Val ss = em.reduce("tosa.reduce_sum", em.mul(x, x), 1);
    Val ms = em.add(em.mul(ss, em.splat({1, 1}, "f32", fmt_float(1.0 / double(d)))),
                    em.splat({1, 1}, "f32", fmt_float(double(D.rms_eps))));
    return em.mul(em.mul(x, em.unary("tosa.rsqrt", ms)), w);
  };
  // Interleaved RoPE on x [T, n, hd]: pairs (2i, 2i+1); c, s [T, 1, half, 1].
  auto rope = [&](Emitter& em, const Val& x, const Val& c, const Val& s) {
    const int64_t n = x.shape[1];
    Val p = em.reshape(x, {T, n, half, 2});
    Val x0 = em.slice(p, {0, 0, 0, 0}, {T, n, half, 1});
    Val x1 = em.slice(p, {0, 0, 0, 1}, {T, n, half, 1});
    Val y0 = em.sub(em.mul(x0, c), em.mul(x1, s));
    Val y1 = em.add(em.mul(x0, s), em.mul(x1, c));
    return em.reshape(em.concat({y0, y1}, 3), {T, n, hd});
  };

  Val tokens = arg("tokens", {1, T}, "i32");
  Val pos = arg("pos", {1, 1}, "i32");
  Val rcos = arg("rope_cos", {1, CAP, half}, "f32");
  Val rsin = arg("rope_sin", {1, CAP, half}, "f32");

  // ---- embedding lookup ----
  Val x;
  if (quant && S.embd_format == MatrixFormat::Q8_0) {
    const int64_t nb = d / 32;
    Val eq = arg("token_embd.rows.qs", {1, V, d}, "i8");
    Val ed = arg("token_embd.rows.d", {1, V, nb}, "f16");
    Val q = e.cast(e.reshape(e.gather(eq, tokens), {T, nb, 32}), "f32");
    Val sc = e.reshape(e.gather(ed, tokens), {T, nb, 1});
    x = e.reshape(e.mul(q, e.cast(sc, "f32")), {T, d});
  } else {
    Val emb = arg("token_embd", {1, V, d}, "f32");
    x = e.reshape(e.gather(emb, tokens), {T, d});
  }

  // ---- positions, RoPE tables, mask, scatter indices (shared by the layers) ----
  std::vector<int64_t> iota_t(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) iota_t[size_t(t)] = t;
  Val pidx = e.add(e.const_i32({1, T}, iota_t), pos);  // [1, T] positions
  Val c = e.reshape(e.gather(rcos, pidx), {T, 1, half, 1});
  Val s = e.reshape(e.gather(rsin, pidx), {T, 1, half, 1});
  // mask: key j is visible from query row r = t*G + g iff j <= pos + t.
  std::vector<int64_t> jcol(static_cast<size_t>(W)), trow(static_cast<size_t>(T * G));
  for (int64_t j = 0; j < W; ++j) jcol[size_t(j)] = j;
  for (int64_t r = 0; r < T * G; ++r) trow[size_t(r)] = r / G;
  Val diff = e.sub(e.const_i32({1, 1, W}, jcol), e.const_i32({1, T * G, 1}, trow));  // j - t
  Val masked = e.greater(diff, e.reshape(pos, {1, 1, 1}));
  // K scatter (scalars): index (kvh*hd + i)*CAP + pos + t, input order (kvh, i, t);
  // V scatter (rows of hd): index kvh*CAP + pos + t, input order (kvh, t).
  std::vector<int64_t> kbase(static_cast<size_t>(kvd * T)), vbase(static_cast<size_t>(KVH * T));
  for (int64_t k = 0; k < kvd; ++k)
    for (int64_t t = 0; t < T; ++t) kbase[size_t(k * T + t)] = k * CAP + t;
  for (int64_t h = 0; h < KVH; ++h)
    for (int64_t t = 0; t < T; ++t) vbase[size_t(h * T + t)] = h * CAP + t;
  Val kidx = e.add(e.const_i32({1, kvd * T}, kbase), pos);
  Val vidx = e.add(e.const_i32({1, KVH * T}, vbase), pos);
  const double inv_sqrt_hd = 1.0 / std::sqrt(double(hd));

  // ---- one outlined function per layer weight-format signature ----
  // (compiled once, called n_layer times: compile time does not grow with depth)
  std::map<std::string, std::string> layer_fns;  // format signature -> function name
  std::ostringstream fns;
  auto fmt_of = [&](int64_t l, int which) {
    return quant ? S.layer_formats.at(size_t(l * 7 + which)) : MatrixFormat::F32;
  };
  const char* mnames[7] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                           "ffn_gate", "ffn_up", "ffn_down"};
  const int64_t mins[7] = {d, d, d, qd, d, d, ff};
  const int64_t mouts[7] = {qd, kvd, kvd, d, ff, ff, d};
  auto layer_fn = [&](int64_t l) -> std::string {
    std::string key;
    for (int k = 0; k < 7; ++k) key += std::to_string(int(fmt_of(l, k)));
    auto it = layer_fns.find(key);
    if (it != layer_fns.end()) return it->second;
    const std::string name = "layer_" + std::to_string(layer_fns.size());
    Fn f;
    Emitter& le = f.e;
    Val lx = f.param("x", x.shape, "f32");
    Val lc = f.param("cos", c.shape, "f32");
    Val ls = f.param("sin", s.shape, "f32");
    Val lmask = f.param("masked", masked.shape, "i1");
    Val lkidx = f.param("kidx", kidx.shape, "i32");
    Val lvidx = f.param("vidx", vidx.shape, "i32");
    Val attn_norm = f.param("attn_norm", {1, d}, "f32");
    Val mats[7];
    for (int k = 0; k < 4; ++k) mats[k] = matrix(f, mnames[k], mins[k], mouts[k], fmt_of(l, k));
    Val ffn_norm = f.param("ffn_norm", {1, d}, "f32");
    for (int k = 4; k < 7; ++k) mats[k] = matrix(f, mnames[k], mins[k], mouts[k], fmt_of(l, k));
    Val kc = f.param("k_cache", {1, kvd * CAP, 1}, "f32");
    Val vc = f.param("v_cache", {1, KVH * CAP, hd}, "f32");
    // ---- attention ----
    Val h = rms_norm(le, lx, attn_norm);
    Val q = rope(le, le.reshape(linear(le, h, mats[0]), {T, H, hd}), lc, ls);
    Val k = rope(le, le.reshape(linear(le, h, mats[1]), {T, KVH, hd}), lc, ls);
    Val v = le.reshape(linear(le, h, mats[2]), {T, KVH, hd});
    // KV writes at positions pos..pos+T-1 (in place after bufferization).
    kc = le.scatter(kc, lkidx, le.reshape(le.transpose(k, {1, 2, 0}), {1, kvd * T, 1}));
    vc = le.scatter(vc, lvidx, le.reshape(le.transpose(v, {1, 0, 2}), {1, KVH * T, hd}));
    // Key window: Kt [KVH, hd, W], V [KVH, W, hd].
    Val kwin = le.slice(le.reshape(kc, {KVH, hd, CAP}), {0, 0, 0}, {KVH, hd, W});
    Val vwin = le.slice(le.reshape(vc, {KVH, CAP, hd}), {0, 0, 0}, {KVH, W, hd});
    // Queries grouped by KV head: [KVH, T*G, hd], row r = t*G + g (head = kvh*G + g).
    Val qg =
        le.reshape(le.transpose(le.reshape(q, {T, KVH, G, hd}), {1, 0, 2, 3}), {KVH, T * G, hd});
    Val sc = le.mul(le.matmul(qg, kwin), le.splat({1, 1, 1}, "f32", fmt_float(inv_sqrt_hd)));
    sc = le.select(lmask, le.splat({1, 1, 1}, "f32", "-1.0e+30"), sc);
    Val mx = le.reduce("tosa.reduce_max", sc, 2);
    Val ex = le.unary("tosa.exp", le.sub(sc, mx));
    Val sum = le.reduce("tosa.reduce_sum", ex, 2);
    Val o = le.mul(le.matmul(ex, vwin), le.unary("tosa.reciprocal", sum));  // [KVH, T*G, hd]
    o = le.reshape(le.transpose(le.reshape(o, {KVH, T, G, hd}), {1, 0, 2, 3}), {T, qd});
    Val x1 = le.add(lx, linear(le, o, mats[3]));
    // ---- SwiGLU MLP ----
    Val h2 = rms_norm(le, x1, ffn_norm);
    Val g = linear(le, h2, mats[4]);
    Val u = linear(le, h2, mats[5]);
    Val act = le.mul(le.mul(g, le.unary("tosa.sigmoid", g)), u);
    Val x2 = le.add(x1, linear(le, act, mats[6]));
    std::vector<Val> rets{x2, kc, vc};
    fns << "  func.func private @" << name << "(" << signature(f.params) << ") -> (" << types(rets)
        << ") {\n"
        << le.body.str() << "    return " << names(rets) << " : " << types(rets) << "\n  }\n";
    layer_fns[key] = name;
    return name;
  };

  // Main-function arguments: every layer's weights, then the head, then the caches.
  std::vector<std::vector<Val>> layer_w(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto& w = layer_w[size_t(l)];
    w.push_back(arg(p + "attn_norm", {1, d}, "f32"));
    for (int k = 0; k < 7; ++k) {
      if (k == 4) w.push_back(arg(p + "ffn_norm", {1, d}, "f32"));
      for (const MatrixPart& part : matrix_parts(mins[k], mouts[k], fmt_of(l, k))) {
        w.push_back(arg(p + mnames[k] + part.suffix, part.shape, part.elem));
      }
    }
  }
  Val out_norm = arg("output_norm", {1, d}, "f32");
  std::vector<Val> kcs, vcs;
  Val lm_head;
  {
    const MatrixFormat hf = quant ? S.embd_format : MatrixFormat::F32;
    // Declare through mainf so that dequantization (if any) is emitted in main.
    const size_t before = mainf.params.size();
    lm_head = matrix(mainf, "lm_head", d, V, hf);
    for (size_t i = before; i < mainf.params.size(); ++i) {
      const Val& v = mainf.params[i];
      std::string nm = "lm_head";
      for (const MatrixPart& part : matrix_parts(d, V, hf))
        if ("%" + ident("lm_head" + part.suffix) == v.name) nm = "lm_head" + part.suffix;
      out.args.push_back(ArgInfo{nm, v.shape, v.elem});
    }
  }
  for (int64_t l = 0; l < L; ++l)
    kcs.push_back(arg("k_cache." + std::to_string(l), {1, kvd * CAP, 1}, "f32"));
  for (int64_t l = 0; l < L; ++l)
    vcs.push_back(arg("v_cache." + std::to_string(l), {1, KVH * CAP, hd}, "f32"));

  for (int64_t l = 0; l < L; ++l) {
    const std::string fname = layer_fn(l);
    std::vector<Val> ops{x, c, s, masked, kidx, vidx};
    for (const Val& w : layer_w[size_t(l)]) ops.push_back(w);
    ops.push_back(kcs[size_t(l)]);
    ops.push_back(vcs[size_t(l)]);
    Val r = e.fresh({}, "");
    std::vector<Val> rets{Val{r.name + "#0", x.shape, "f32"},
                          Val{r.name + "#1", kcs[size_t(l)].shape, "f32"},
                          Val{r.name + "#2", vcs[size_t(l)].shape, "f32"}};
    e.body << "    " << r.name << ":3 = func.call @" << fname << "(" << names(ops) << ") : ("
           << types(ops) << ") -> (" << types(rets) << ")\n";
    x = rets[0];
    kcs[size_t(l)] = rets[1];
    vcs[size_t(l)] = rets[2];
  }
  Val xn = rms_norm(e, x, out_norm);
  Val logits = linear(e, xn, lm_head);  // [T, V]
  std::vector<Val> results{logits};
  out.results.push_back(ArgInfo{"logits", logits.shape, logits.elem});
  for (int64_t l = 0; l < L; ++l) {
    results.push_back(kcs[size_t(l)]);
    out.results.push_back(ArgInfo{"k_cache." + std::to_string(l), kcs[size_t(l)].shape, "f32"});
  }
  for (int64_t l = 0; l < L; ++l) {
    results.push_back(vcs[size_t(l)]);
    out.results.push_back(ArgInfo{"v_cache." + std::to_string(l), vcs[size_t(l)].shape, "f32"});
  }
  if (S.argmax) {
    // nan_mode IGNORE: strict ogt against the running maximum, so the lowest id
    // among equal maxima wins and a NaN never replaces it (the default,
    // PROPAGATE, makes the first NaN win). See prefill_greedy in engine.cpp.
    Val am = e.emit("tosa.argmax", {logits}, {T}, "i32",
                    "{axis = 1 : i32, nan_mode = #tosa.nan_mode<IGNORE>}");
    results.push_back(am);
    out.results.push_back(ArgInfo{"argmax", am.shape, am.elem});
  }

  std::ostringstream m;
  m << "module {\n" << fns.str();
  m << "  func.func @" << func_name << "(" << signature(mainf.params) << ") -> (" << types(results)
    << ") attributes {llvm.emit_c_interface} {\n";
  m << e.body.str();
  m << "    return " << names(results) << " : " << types(results) << "\n  }\n}\n";
  out.mlir = m.str();
  return out;
}

}  // namespace touchstone::static_graph
