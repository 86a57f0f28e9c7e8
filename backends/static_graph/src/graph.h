// graph.h - builds the whole-model step graph of a Llama model as MLIR text
// (TOSA 1.0 + func), with static shapes.
//
// One graph = one (T, W) pair: T tokens processed at positions pos..pos+T-1
// (T = 1 is the decode step, T > 1 a prefill bucket), attention over the key
// window [0, W) of the KV cache (W <= capacity). Signature (all tensors):
//
//   func.func @step(%tokens: tensor<1xTxi32>, %pos: tensor<1x1xi32>,
//                   %rope_cos, %rope_sin: tensor<1xCAPx(hd/2)xf32>,
//                   <weights ...>,
//                   %k_cache: tensor<1x(L*KVH*hd*CAP)x1xf32>,     K transposed: [L][KVH][hd][CAP]
//                   %v_cache: tensor<1x(L*KVH*CAP)xhdxf32>)       V rows:       [L][KVH][CAP][hd]
//       -> (tensor<TxVOCABxf32> logits, k_cache', v_cache')
//
// The caches are returned after tosa.scatter writes of the T new entries; the
// lowering (one-shot bufferize + drop-equivalent-buffer-results) turns them
// into buffers updated in place (no copy), see compiler.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace touchstone::static_graph {

enum class WeightMode { FullPrecision, Quantized };

// How one weight matrix enters the graph.
enum class MatrixFormat {
  F32,   // fp32 [1][in][out] (transposed at load)
  Q4_1,  // qs i8 [nb][16][out], d f16 [nb][1][out], m f16 [nb][1][out]
  Q4_0,  // qs i8 [nb][16][out], d f16 [nb][1][out]
  Q8_0,  // qs i8 [nb][32][out], d f16 [nb][1][out]
};

struct ModelDims {
  int32_t n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_vocab = 0;
  float rms_eps = 1e-5f;
};

struct GraphSpec {
  int32_t T = 1;         // tokens per call (padded bucket size)
  int32_t W = 0;         // attention window (keys 0..W-1)
  int32_t capacity = 0;  // KV cache capacity (positions)
  WeightMode mode = WeightMode::FullPrecision;
  // Per-matrix formats in quantized mode (index: layer*7 + {q,k,v,o,gate,up,down}),
  // plus the LM head / embedding format (Q8_0 or F32).
  std::vector<MatrixFormat> layer_formats;
  MatrixFormat embd_format = MatrixFormat::F32;
  bool argmax = false;  // also return argmax token ids (tensor<Txi32>)
};

// One function argument: name (for export), MLIR tensor type, shape, element type.
struct ArgInfo {
  std::string name;
  std::vector<int64_t> shape;
  std::string elem;  // "f32", "f16", "i8", "i32"
};

struct BuiltGraph {
  std::string mlir;           // module text
  std::vector<ArgInfo> args;  // in order
  std::vector<ArgInfo> results;
};

BuiltGraph build_step_graph(const ModelDims& dims, const GraphSpec& spec,
                            const std::string& func_name);

}  // namespace touchstone::static_graph
