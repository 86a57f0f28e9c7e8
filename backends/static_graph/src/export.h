// export.h - writes the static_graph modules (MLIR text, TOSA 1.0) and their
// weights, for another MLIR-based compiler (IREE cross-check: tests/iree_crosscheck.sh).
#pragma once

#include <cstdint>
#include <string>

namespace touchstone::static_graph {

struct ExportOptions {
  bool quantized = false;         // 4-bit weights (GGUF blocks) dequantized in the graph
  int32_t capacity = 64;          // KV cache capacity baked into the shapes
  bool with_prefill = true;       // also write the prefill bucket modules
  bool with_reference_io = true;  // write inputs + JIT logits of one decode step (cross-check)
};

// Writes into out_dir:
//   decode.mlir, prefill_<T>.mlir   one func.func @step each (see graph.h for the signature)
//   manifest.json                   argument/result names, shapes, dtypes, file names, buckets
//   weights/<name>.npy              one NumPy file per weight argument (graph layout)
//   check/*.npy                     inputs of one decode step + the logits the in-process JIT gave
void export_modules(const std::string& model_path, const std::string& out_dir,
                    const ExportOptions& opt);

}  // namespace touchstone::static_graph
