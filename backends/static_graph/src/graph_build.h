// graph_build.h - what the step graph's builder (graph.cpp, graph_moe.cpp,
// graph_build.cpp) shares: values and the TOSA text emitter, the sizes of the graph being
// built, a layer's parameters, and the building blocks more than one file uses. Internal
// to the static_graph backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "graph.h"

namespace touchstone::static_graph::graph_build {

using Shape = std::vector<int64_t>;

struct Val {
  std::string name;
  Shape shape;
  std::string elem;
};

inline std::string tensor_type(const Shape& s, const std::string& e) {
  std::string t = "tensor<";
  for (int64_t d : s) t += std::to_string(d) + "x";
  return t + e + ">";
}
inline std::string tensor_type(const Val& v) { return tensor_type(v.shape, v.elem); }

inline int64_t numel(const Shape& s) {
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
  Val equal(const Val& a, const Val& b) { return emit("tosa.equal", {a, b}, bcast(a, b), "i1"); }
  // x repeated `times` along a leading dim of 1: [1, ...] -> [times, ...].
  Val tile0(const Val& x, int64_t times) {
    Shape m(x.shape.size(), 1);
    m[0] = times;
    return tile(x, m);
  }
  // x repeated multiples[i] times along dim i.
  Val tile(const Val& x, const Shape& multiples) {
    Shape s = x.shape;
    for (size_t i = 0; i < s.size(); ++i) s[i] *= multiples[i];
    return emit("tosa.tile", {x, shape_const(multiples)}, s, x.elem);
  }
  // Index of the largest value along axis 1 of x [R, n] as [R, 1] (i32); equal maxima:
  // the lowest index; NaN never wins (nan_mode IGNORE: strict ogt against the running
  // maximum).
  Val argmax1(const Val& x) {
    Val a = emit("tosa.argmax", {x}, {x.shape[0]}, "i32",
                 "{axis = 1 : i32, nan_mode = #tosa.nan_mode<IGNORE>}");
    return reshape(a, {x.shape[0], 1});
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

inline std::string fmt_float(double v) {
  std::ostringstream o;
  o.precision(9);
  o << std::scientific << v;
  return o.str();
}

// Sizes of the model and of the graph being built, and its faults.
struct Ctx {
  int64_t T, W, CAP, L, d, ff, H, KVH, hd, V, G, qd, kvd, half;  // half = n_rot / 2
  double eps;  // RMSNorm epsilon (times the rms_eps_10x fault's scale)
  GraphFaults F;
  ModelDims M;         // the family features
  bool block = false;  // GraphSpec::block: the T rows attend one another both ways
};

// A layer function's parameters: weights by name (matrices as their fp32
// operands), then the caches.
struct LayerParams {
  std::map<std::string, Val> vec;
  std::vector<Val> mats[kLayerMatrices];
  Val kc, vc;
};

// y [T, out] = x [T, in] . M (M's input-dim slices: the thread_order_reduction fault).
Val linear(Emitter& em, const Ctx& C, const Val& x, const std::vector<Val>& m);
// tanh-GELU of g (HF gelu_pytorch_tanh).
Val gelu_tanh(Emitter& le, const Val& g);
// The gate's activation of the model: SiLU (SwiGLU) or tanh-GELU (GeGLU).
Val activation(Emitter& le, const Ctx& C, const Val& g);
// down(act(x . gate) * (x . up)); m: the gate, up and down matrices' operands.
Val gated_ffn(Emitter& le, const Ctx& C, const Val& x, const std::vector<Val>* m);
// The mixture-of-experts FFN of x [T, d] (graph_moe.cpp).
Val moe_ffn(Emitter& le, const Ctx& C, const LayerParams& p, const Val& x);

}  // namespace touchstone::static_graph::graph_build
