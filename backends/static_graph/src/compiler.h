// compiler.h - in-process compilation of a graph module (MLIR text) to native
// code: explicit pass pipeline TOSA -> linalg -> (transform dialect) ->
// bufferized memrefs -> LLVM dialect -> mlir::ExecutionEngine (host target
// machine). Compiled objects can be cached on disk and reloaded with ORC.
//
// No MLIR/LLVM type appears in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace touchstone::static_graph {

struct CompileOptions {
  std::string cache_dir;  // "" = no on-disk cache
  bool vectorize = true;  // transform-dialect schedule for the matmuls
  // Matmuls tiled into parallel column strips run on OpenMP threads (scf.forall
  // -> scf.parallel -> omp.wsloop). Only honoured with vectorize; compile_graph
  // turns it off when the OpenMP runtime cannot be loaded.
  bool parallel = true;
};

// The OpenMP runtime (libomp.so.5), loaded once into the process: its path, or
// "" when it cannot be loaded (then every graph is compiled sequentially).
const std::string& openmp_runtime();

// Thread count for the parallel strips of the graphs called next from this
// thread (omp_set_num_threads), n >= 1. No-op without the runtime.
void set_num_threads(int n);

// A compiled step function: call(args) where args[i] points to the i-th
// argument value (here: a pointer to a memref descriptor), in the order of the
// *lowered* signature (inputs, then out-params).
class CompiledGraph {
 public:
  virtual ~CompiledGraph() = default;
  virtual void call(void** args) const = 0;
  double compile_seconds = 0.0;  // wall time of compile_graph()
  bool from_cache = false;
  std::string cache_key;
  int lowered_num_args = -1;  // arguments of the bufferized function (-1: loaded from cache)
};

// The pass pipeline as text (for docs, logs and the cache key).
std::string pipeline_description(const CompileOptions& opt);

// Compiles `mlir_text` (one func.func named `func_name` with llvm.emit_c_interface).
// Throws std::runtime_error with the MLIR diagnostics on failure.
std::unique_ptr<CompiledGraph> compile_graph(const std::string& mlir_text,
                                             const std::string& func_name,
                                             const CompileOptions& opt);

// Runs the pipeline up to (and including) bufferization + out-param rewriting
// and returns the module text: what the in-place KV test inspects.
std::string lower_to_buffers(const std::string& mlir_text, const CompileOptions& opt);

// Parses and verifies `mlir_text` (used by export).
void verify_module_text(const std::string& mlir_text);

// Host CPU description (LLVM's host CPU name + features hash).
std::string host_cpu_name();

}  // namespace touchstone::static_graph
