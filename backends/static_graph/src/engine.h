// engine.h - the static_graph model/session logic behind the C ABI (and used
// directly by the unit tests and the exporter).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "compiler.h"
#include "graph.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/model_weights.h"

namespace touchstone::static_graph {

// The architectures (GGUF general.architecture) and model features
// (ModelConfig::feature_names(), docs/model-families.md) the graphs compute,
// comma-separated as the ABI v3 table declares them. load_model refuses
// anything else with TS_ERR_UNSUPPORTED naming it.
inline constexpr const char* kArchitectures =
    "llama,qwen2,qwen3,gemma3,phi3,qwen3moe,qwen2moe,gpt-oss";
inline constexpr const char* kModelFeatures =
    "neox_rope,partial_rotary,key_length_head_dim,rope_freqs,linear_rope_scaling,"
    "sliding_window,per_layer_rope_base,qkv_bias,qk_norm,post_norms,fused_qkv,fused_gate_up,"
    "geglu,embedding_scale,attention_scale,final_logit_softcap,moe,moe_shared_expert,yarn_rope,"
    "attn_output_bias,attention_sinks,moe_topk_softmax,moe_biases,swiglu_oai";

// A host tensor, 64-byte aligned.
struct HostTensor {
  std::shared_ptr<uint8_t> data;
  std::vector<int64_t> shape;
  std::string elem;  // f32 f16 i8 i32
  size_t bytes = 0;
  static HostTensor make(std::vector<int64_t> shape, const std::string& elem);
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data.get());
  }
};

size_t elem_size(const std::string& elem);

// Weights of one weight path, keyed by graph argument name.
struct WeightSet {
  std::map<std::string, HostTensor> tensors;
  GraphSpec spec_template;  // mode + per-matrix formats
  size_t bytes = 0;
};

// One RoPE table of the model: theta(p, i) = p / scale * base^(-2i / n_rot) / freq_factor[i]
// (touchstone::ops::rope_theta); layers share a table when (base, scale) match.
struct RopeTable {
  double base = 10000.0, scale = 1.0;
};

struct GraphModel {
  std::string path;
  ModelConfig config;                  // read_model_config
  ModelDims dims;                      // config as the graph sees it (dims_of)
  std::vector<RopeTable> rope_tables;  // dims.layer_rope indexes these
  std::vector<float> rope_freqs;       // rope_freqs.weight (n_rot/2 divisors) or empty
  int32_t n_ctx_train = 0;
  std::mutex mu;
  std::unique_ptr<WeightSet> full, quant;
  // Quantized sets packed with a quantized-only fault (quant_scale_min_swap,
  // nibble_order: a packer bug), by fault name; test only.
  std::map<std::string, std::unique_ptr<WeightSet>> faulty;
  // Compiled graphs shared by the sessions of this model, keyed by graph identity.
  std::map<std::string, std::shared_ptr<CompiledGraph>> graphs;
  // Loads on first use (thread-safe). A quantized-only fault selects a faulty
  // quantized set (full precision: no effect); other faults do not matter here.
  const WeightSet& weights(WeightMode mode, const touchstone::Faults& faults = {});
};

std::unique_ptr<GraphModel> load_model(const std::string& gguf_path);

// Bucket scheme (documented in docs/backends/static_graph.md).
struct BucketConfig {
  std::vector<int32_t> prefill = {16, 64};  // padded prompt lengths (ascending)
  std::vector<int32_t> windows = {
      256, 1024};  // decode/prefill attention windows (<= capacity; capacity added)
};

struct Chunk {
  int32_t start = 0;  // offset in the prompt
  int32_t n = 0;      // real tokens
  int32_t T = 0;      // graph token count (bucket or 1)
  int32_t W = 0;      // attention window
};

// Splits a prompt of n tokens starting at position pos into graph calls.
std::vector<Chunk> plan_prefill(int32_t pos, int32_t n, int32_t capacity, const BucketConfig& b);
int32_t pick_window(int32_t needed, int32_t capacity, const BucketConfig& b);

struct GraphStats {
  std::string name;
  double compile_seconds = 0;
  bool from_cache = false;
};

class GraphSession {
 public:
  // n_threads: threads of the matmuls' parallel column strips (OpenMP), 0 =
  // the hardware threads; results do not depend on it (bitwise) unless the
  // thread_order_reduction fault is set. faults: test only (one deliberate bug,
  // docs/backends/static_graph.md#fault-catalog); default: none.
  GraphSession(GraphModel& m, WeightMode mode, int32_t capacity, int n_threads,
               const touchstone::Faults& faults = {});
  // Runs tokens[0..n) at the current position. logits: n*V (all) or V floats.
  void prefill(const int32_t* tokens, int32_t n, bool all_positions, float* logits);
  void decode(int32_t token, float* logits);
  // Runs tokens[0..n) like prefill and returns the greedy token of the last
  // position (lowest id among equal maxima, NaN never wins), computed in the
  // graph (tosa.argmax): the last chunk runs a graph variant with an argmax
  // output, compiled on first use; the logits are not copied out.
  int32_t prefill_greedy(const int32_t* tokens, int32_t n);
  // ABI v8: n input embeddings (n x n_embd() floats, the rows as given) at the current
  // position, logits as prefill. bidirectional: the n rows are one block attending
  // both ways (Gemma 3's image), run as one call of exactly n rows (a graph per block
  // size, compiled on first use); otherwise the prefill's buckets, causally.
  void prefill_embeddings(const float* embd, int32_t n, bool bidirectional, bool all_positions,
                          float* logits);
  int32_t n_embd() const { return m_.dims.n_embd; }
  void rewind(int32_t p);
  int32_t position() const { return pos_; }
  int32_t max_context() const { return cap_; }
  int32_t n_vocab() const { return m_.dims.n_vocab; }
  const std::vector<GraphStats>& compiled() const { return stats_; }
  // KV cache storage (for tests proving in-place updates).
  const float* k_cache() const { return kc_.as<float>(); }
  const float* v_cache() const { return vc_.as<float>(); }
  // RoPE table k (GraphModel::rope_tables), [capacity][n_rot/2] fp32.
  const float* rope_cos(size_t k = 0) const { return rcos_.at(k).as<float>(); }
  const float* rope_sin(size_t k = 0) const { return rsin_.at(k).as<float>(); }
  // Layer taps (ABI v4): while on, every call records the last row it ran,
  // [n_layer][3][n_embd] f32 (TS_TAP_* order). Turning them on or off clears
  // the record. The graphs always compute them (the logits cannot depend on it).
  void set_taps(bool on) {
    taps_on_ = on;
    taps_.clear();
  }
  const std::vector<float>& taps() const { return taps_; }
  BucketConfig buckets;

 private:
  struct Graph {
    BuiltGraph built;
    std::shared_ptr<CompiledGraph> compiled;
  };
  // The graph's input: token ids, input embeddings, or embeddings as one block.
  enum class Input { Tokens, Embeddings, Block };
  Graph& graph(int32_t T, int32_t W, bool argmax, Input input = Input::Tokens);
  GraphFaults graph_faults() const;     // the graph-side part of faults_
  void perturb_logits(int32_t n_rows);  // logits_perturb_1e-3 fault, on out_
  // greedy != nullptr: runs the argmax variant and stores the argmax of row c.n-1.
  // embd != nullptr: the chunk's rows are input embeddings (tokens unused), a block
  // when `block`.
  void run(const Chunk& c, const int32_t* tokens, float* logits_rows, int32_t* greedy = nullptr,
           const float* embd = nullptr, bool block = false);
  // The chunks of one call of n rows (token ids, or embd): every row's logits into
  // logits when all_positions, else the last row's.
  void run_chunks(const std::vector<Chunk>& plan, int32_t n, const int32_t* tokens,
                  const float* embd, bool block, bool all_positions, float* logits);

  GraphModel& m_;
  WeightMode mode_;
  const WeightSet& w_;
  int32_t cap_;
  int n_threads_;  // OpenMP threads of the matmul strips (>= 1; 0 at open = hardware threads)
  int32_t pos_ = 0;
  touchstone::Faults faults_;
  int32_t kv_len_ = 0;  // KV entries valid (rewind_noop fault: never truncated by rewind)
  HostTensor kc_, vc_;
  std::vector<HostTensor> rcos_, rsin_;  // by RoPE table
  // prefill_position_reset fault: RoPE tables shifted by rope_origin_ rows for
  // the current prefill call (row p holds position p - origin).
  int32_t rope_origin_ = 0;
  std::vector<HostTensor> shifted_cos_, shifted_sin_;
  bool taps_on_ = false;
  std::vector<float> taps_, taps_out_;  // the record; the graph's taps output
  void shift_rope_tables(int32_t origin);
  // session_order_reduction fault: this session's matmul slices, decided at
  // its first graph (1: the first session of the process to run, 2: later ones).
  mutable int32_t session_slices_ = 0;
  std::map<std::tuple<int32_t, int32_t, bool, Input>, Graph> graphs_;  // (T, W, argmax, input)
  std::vector<GraphStats> stats_;
  std::vector<float> out_;
};

std::string default_cache_dir();

}  // namespace touchstone::static_graph
