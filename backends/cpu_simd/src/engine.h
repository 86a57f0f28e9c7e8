// engine.h - the cpu_simd forward pass (model views, sessions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kernels.h"
#include "solo_governor.h"
#include "thread_pool.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/model/rope_yarn.h"

namespace touchstone::cpu_simd {

// One weight matrix [n_out][n_in]: either GGUF blocks (q) or fp32 (f).
// GGUF blocks of Q4_0/Q4_1/Q8_0 have dedicated kernels (qtype); any other type
// the reference dequantizer knows (Q4_K, Q6_K, Q5_x, ...) goes through the
// generic block kernel (generic = true, gtype, block_elems/block_bytes).
struct Linear {
  const uint8_t* q = nullptr;
  QType qtype = QType::Q4_1;
  bool generic = false;
  int gtype = -1;  // GGUF ggml_type of a generic matrix
  size_t block_elems = 32, block_bytes = 0;
  size_t row_bytes = 0;
  // Q4_0 / Q4_1 / Q5_0 / Q8_0 with n_out % 16 == 0, in int8 mode on AVX-512
  // VNNI: the same blocks row-interleaved (repack_r16), else nullptr.
  const uint8_t* r16 = nullptr;
  const float* f = nullptr;
  size_t n_out = 0, n_in = 0;
};

// One layer's weights. Optional vectors are nullptr when the config does not use
// them (bq/bk/bv: qkv_bias; bo: attn_out_bias; sinks: attn_sinks; q_norm/k_norm:
// qk_norm; post_*: post_norms; the router's and experts' biases: moe.biases). Fused
// Phi-3 matrices are row ranges of the fused tensor (same blocks, no copy).
// Mixture-of-experts layers (ModelConfig::moe) have no gate / up / down but a
// router [n_expert][n_embd] and per expert e the row range e of the 3-D GGUF
// tensors (ggml shape {n_in, n_out, n_expert}: expert e's rows are contiguous).
struct LayerView {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr;
  const float* sinks = nullptr;  // [n_head] attention sink logits (gpt-oss)
  const float *q_norm = nullptr, *k_norm = nullptr;
  const float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
  Linear wq, wk, wv, wo, gate, up, down;
  Linear router;  // ffn_gate_inp (MoE only)
  // gpt-oss: router bias [n_expert]; expert e's gate / up biases at e * n_ff_exp,
  // its down bias at e * n_embd.
  const float *router_b = nullptr, *gate_exps_b = nullptr, *up_exps_b = nullptr,
              *down_exps_b = nullptr;
  std::vector<Linear> gate_exps, up_exps, down_exps;  // [n_expert] (MoE only)
  // Shared expert (qwen2moe: moe.n_ff_shexp > 0): its gate vector [n_embd]
  // (ffn_gate_inp_shexp) and its gated FFN (ffn_{gate,up,down}_shexp); else null / empty.
  const float* shexp_gate = nullptr;
  Linear gate_shexp, up_shexp, down_shexp;
  // Every matrix of the layer (experts included), for the passes over all of them.
  std::vector<Linear*> matrices();
};

struct WeightSet {
  std::vector<LayerView> layers;
  Linear lm_head;
  const float* output_norm = nullptr;
};

// The architectures (GGUF general.architecture) and the model features
// (ModelConfig::feature_names(), docs/model-families.md) this engine computes,
// comma-separated as the ABI v3 table declares them. SimdModel() refuses anything
// else with touchstone::UnsupportedModel naming it.
inline constexpr const char* kArchitectures =
    "llama,qwen2,qwen3,gemma3,phi3,qwen3moe,gpt-oss,qwen2moe";
inline constexpr const char* kModelFeatures =
    "neox_rope,partial_rotary,key_length_head_dim,rope_freqs,linear_rope_scaling,"
    "sliding_window,per_layer_rope_base,qkv_bias,qk_norm,post_norms,fused_qkv,fused_gate_up,"
    "geglu,embedding_scale,attention_scale,final_logit_softcap,moe,yarn_rope,attn_output_bias,"
    "attention_sinks,moe_topk_softmax,moe_biases,swiglu_oai,moe_shared_expert";

class SimdModel {
 public:
  explicit SimdModel(const std::string& path);
  const touchstone::ModelConfig& config() const { return cfg_; }
  // rope_freqs.weight (n_rot/2 divisors) or nullptr.
  const float* rope_freqs() const { return rope_freqs_.empty() ? nullptr : rope_freqs_.data(); }
  // Throws StatusError(TS_ERR_UNSUPPORTED) when a matrix type has no quantized kernel.
  const WeightSet& quantized() const;
  // quantized() with every Q4_0 / Q4_1 / Q5_0 / Q8_0 matrix whose rows are a
  // multiple of 16 also repacked for gemm_q_r16 (made on first use, thread-safe; the
  // int8 activation mode on AVX-512 VNNI). Memory: one more copy of those
  // matrices.
  const WeightSet& quantized_r16();
  const WeightSet& full_precision();  // dequantizes on first use (thread-safe)
  // Embedding row of `token` as fp32 (full precision: from the fp32 copy).
  void embed(int32_t token, bool fp32, float* out) const;
  uint64_t quantized_bytes_per_token() const;  // weight bytes streamed per decoded token
  // The decode-step governor of the sessions with this `key` (thread count and
  // weight path): whether the next step runs solo, and its measured time (s).
  bool governor_choose(int key) {
    std::lock_guard<std::mutex> lock(governors_mu_);
    return governors_[key].choose();
  }
  void governor_record(int key, bool solo, double seconds) {
    std::lock_guard<std::mutex> lock(governors_mu_);
    governors_[key].record(solo, seconds);
  }
  SoloGovernor governor(int key) {
    std::lock_guard<std::mutex> lock(governors_mu_);
    return governors_[key];
  }

 private:
  std::string path_;
  // The file's bytes are released once the quantized matrices and the embedding are
  // copied out (release_file); the full-precision path then reads the file again.
  touchstone::gguf::File file_;
  std::vector<uint8_t> embd_bytes_;  // token_embd.weight's blocks once the file is released
  touchstone::ModelConfig cfg_;
  std::vector<std::vector<float>> norms_;  // fp32 norms/biases (quantized path)
  std::vector<float> rope_freqs_;
  WeightSet q_;
  // The quantized matrices' GGUF blocks, byte for byte, copied into one
  // anonymous 2 MiB-aligned arena (transparent huge pages requested).
  struct ArenaFree {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, ArenaFree> arena_;
  void relocate_quantized();
  void release_file();
  bool file_releasable();
  std::vector<bool> discardable_sources(const std::vector<Linear*>& all);
  touchstone::gguf::File reopened() const;
  std::string q_unsupported_;  // non-empty: why the quantized path is unavailable
  const touchstone::gguf::TensorInfo* embd_ = nullptr;
  // Decode-step governors (solo_governor.h), one per thread count, shared by
  // this model's sessions: the machine's load outlives a session.
  std::mutex governors_mu_;
  std::map<int, SoloGovernor> governors_;
  std::once_flag r16_once_;
  WeightSet r16_;
  std::unique_ptr<uint8_t, ArenaFree> r16_arena_;
  std::once_flag fp_once_;
  std::unique_ptr<touchstone::ModelWeights> fp_;
  WeightSet f_;
};

struct SimdSessionOptions {
  bool quantized = true;
  // Quantized path only: quantize activations to int8 per 32-block (llama.cpp
  // style, VNNI) instead of fp32 activations. Faster, less accurate; opt-in
  // through TOUCHSTONE_CPU_SIMD_ACTIVATIONS=int8.
  bool int8_activations = false;
  int n_threads = 0;
  int32_t max_context = 0;
  touchstone::Faults faults;
};

class SimdSession;

// One sequence's share of a step_batch call (ABI v6), after the adapter's
// checks: n tokens appended at session->position(); logits holds n rows of
// n_vocab floats (all_positions) or one.
struct BatchEntry {
  SimdSession* session = nullptr;
  const int32_t* tokens = nullptr;
  int32_t n = 0;
  bool all_positions = false;
  float* logits = nullptr;
};

class SimdSession {
 public:
  SimdSession(SimdModel& model, const SimdSessionOptions& opt);
  ~SimdSession();
  // Runs n tokens at positions position()..; writes logits of every position
  // (all_positions) or of the last one, n_vocab floats per row.
  void prefill(const int32_t* tokens, int32_t n, bool all_positions, float* logits);
  // ABI v8 prefill_embeddings: n input embeddings (n x n_embd float32, used as given,
  // without the embedding scale) in place of token ids, as prefill() otherwise.
  // bidirectional: the n also attend to the block's later rows (Gemma 3's image block),
  // so the block is one forward pass (the pass scratch grown to n rows when n > kMaxBatch).
  void prefill_embeddings(const float* embd, int32_t n, bool bidirectional, bool all_positions,
                          float* logits);
  int32_t n_embd() const { return c_.n_embd; }
  // ABI v6 step_batch (engine_batch.cpp): every entry exactly as its session's
  // own prefill(), in passes of at most kMaxBatch tokens (the entries' tokens
  // concatenated) on the first entry's pool and scratch; each weight matrix is
  // read once per pass. Sessions of other options (faults, int8 mode) than the
  // first's run one prefill() each instead.
  static void step_batch(std::span<const BatchEntry> entries);
  // A new session with this one's options holding its KV entries [0, n_prefix)
  // (0 <= n_prefix <= position(), checked by the adapter).
  std::unique_ptr<SimdSession> fork(int32_t n_prefix);
  int32_t position() const { return pos_; }
  // A session-owned [n_vocab] buffer for prefill_greedy (allocated once).
  float* greedy_logits() {
    if (greedy_logits_.empty()) greedy_logits_.resize(size_t(c_.n_vocab));
    return greedy_logits_.data();
  }
  int32_t max_context() const { return max_ctx_; }
  void rewind(int32_t p) {
    pos_ = p;
    embd_last_ = false;
    if (!faults_.rewind_noop) kv_len_ = p;  // the fault keeps stale entries attended
  }
  int n_threads() const { return pool_.size(); }
  // Layer taps (ABI v4): while on, prefill() records the last row of each chunk,
  // [n_layer][3][n_embd] (attention output, FFN output, residual after the layer).
  void set_taps(bool on) {
    taps_on_ = on;
    taps_.clear();
  }
  const std::vector<float>& taps() const { return taps_; }

  static constexpr int32_t kMaxBatch = 128;  // tokens per forward pass (prefill chunk)

 private:
  struct Job {
    const Linear* w;
    float* y;
    size_t ldy;
  };
  // A run of one session's tokens inside a forward pass: pass tokens
  // [first, first + n), at positions pos.. of s's KV cache. A single-session
  // chunk is a pass of one Seg.
  struct Seg {
    SimdSession* s = nullptr;
    const int32_t* tokens = nullptr;
    const float* embd = nullptr;  // ABI v8: input embeddings (n rows) instead of tokens
    bool bidirectional = false;   // and the block attends both ways (Gemma 3's image)
    int32_t first = 0, n = 0;
    int32_t pos = 0;       // position of its first token (s->pos_)
    int32_t rope_pos = 0;  // RoPE position of its first token
    bool all_positions = false;
    float* logits = nullptr;            // all_positions: n rows; else the last token's row; or none
    const SimdSession* leak = nullptr;  // batch_kv_leak fault: entry i-1's session (else none)
    int32_t leak_pos = -1;              // and the position of its last KV entry
    const SimdSession* page_from = nullptr;  // batch_page_boundary_leak fault: entry i-1's session
    int32_t rows() const { return logits ? (all_positions ? n : 1) : 0; }
  };
  // Grouped attention's token blocks: pass tokens [i0, i1) of segs_[seg].
  struct Block {
    int32_t seg, i0, i1;
  };
  void forward_chunk(const int32_t* tokens, int32_t n, bool all_positions, float* logits,
                     int32_t rope_origin);
  // One forward pass over the segments' tokens (at most pass_cap_), on this
  // session's pool and scratch; advances every segment's session (engine_pass.cpp).
  void forward_pass(const Seg* segs, int n_segs);
  void rope_tables();  // layer_rope_, rope_params_, rope_yarn_ (the constructor)
  // The per-pass scratch (activations, RoPE angles, MoE, int8 rows) for B tokens:
  // kMaxBatch at construction, grown for a bidirectional block of more rows (one pass).
  void size_pass_scratch(size_t B);
  void embed_and_rope();
  void attention_block(int32_t layer);
  void ffn_block(int32_t layer);
  // act(gate_) * up_ in place for n_tok rows of width ff (gate_ / up_ rows ff apart);
  // gpt-oss's experts: swiglu_oai(gate_ + bg, up_ + bu) (bg, bu: [ff], engine_moe.cpp).
  void gated_activation(size_t n_tok, size_t ff);
  void swiglu_oai_activation(size_t n_tok, size_t ff, const float* bg, const float* bu);
  // Mixture-of-experts FFN (engine_moe.cpp): xn_'s n_tok_ normed rows -> tmp_.
  void moe_ffn(int32_t layer);
  void moe_route(const LayerView& L);
  void moe_expert(const LayerView& L, int32_t e, const int32_t* slots, size_t n);
  void moe_shared_expert(const LayerView& L);
  void gated_ffn(const Linear& gate, const Linear& up, const Linear& down, size_t ff, float* out);
  void taps_last_token(int32_t layer, int point, const float* rows);
  void logits_head();
  // per_token: fp32 matrices through the matvec for every token count, as on the
  // quantized path (the experts on full precision: an expert's token count depends on
  // what the pass's other tokens chose, its rows' bits must not).
  void linears(const Job* jobs, int n_jobs, const float* x, size_t ldx, size_t n_tok,
               bool per_token = false);
  // Attention of the pass's tokens (all query heads) into att_: grouped
  // (attend_multi_f32) or per (token, head) (attend_f32), the same bits.
  void attention(int32_t layer);
  void attention_grouped(int32_t layer);
  void attention_per_head(int32_t layer);
  // The KV rows of `layer` in this session's cache.
  float* k_rows(int32_t layer) const;
  float* v_rows(int32_t layer) const;
  // Scratch for attention scores of contexts up to ctx (a batch's longest).
  void reserve_scores(int32_t ctx);
  // logits_row_shift / verify_row_shift: row i of an all-position call holds row i-1.
  // batch_all_positions_shift: the same inside a step_batch of several entries (in_batch).
  void shift_rows(int32_t start_pos, int32_t n, bool all_positions, float* logits,
                  bool in_batch) const;
  bool batchable_with(const SimdSession& lead) const;
  static constexpr size_t kMaxAttnQueries = 16;
  size_t attn_queries() const;
  // Fault-only paths (never taken without the fault): a corrupted copy of the
  // quantized blocks (quant_scale_min_swap, nibble_order) and the
  // thread_order_reduction matmul (columns split per thread, summed in order).
  void corrupt_quantized_copy(const WeightSet& src);
  void linear_per_thread(const Linear& W, size_t r0, size_t r1, const float* x, size_t ldx,
                         size_t n_tok, float* y, size_t ldy, int thread);

  SimdModel& model_;
  const touchstone::ModelConfig& c_;
  const WeightSet* w_;
  bool quant_;
  bool int8_;
  touchstone::Faults faults_;
  int32_t max_ctx_;
  int32_t pos_ = 0;
  int32_t kv_len_ = 0;      // KV entries written so far (rewind_noop fault: never truncated)
  SimdSessionOptions opt_;  // fork: the same options
  ThreadPool pool_;
  // Decode steps: parallel or solo, whichever is measured faster (solo_governor.h);
  // off with TOUCHSTONE_CPU_SIMD_SOLO_FALLBACK=0.
  bool governed_ = false;
  int governor_key_ = 0;                        // SimdModel::governor_choose
  uint64_t decode_steps_[2] = {0, 0};           // [parallel, solo]
  WeightSet faulty_w_;                          // quantized-only faults: w_ points here
  std::vector<std::vector<uint8_t>> faulty_q_;  // its corrupted GGUF blocks
  std::vector<float> partial_;                  // thread_order_reduction scratch
  // The current pass (forward_pass): its segments, each token's segment, the
  // grouped attention blocks; batch_token_count_split's slices in step_batch.
  const Seg* segs_ = nullptr;
  int n_segs_ = 0;
  int32_t n_tok_ = 0;
  std::vector<int32_t> tok_seg_;
  std::vector<Block> blocks_;
  int32_t split_slices_ = 0;
  int32_t scores_ctx_ = 0;           // contexts scores_ / multi_scores_ hold
  std::vector<float> batch_logits_;  // a pass's logits rows when several segments want some
  // KV cache [layer][pos][n_head_kv * head_dim] fp32 (calloc: untouched pages cost no RSS).
  // Owned by this session alone, except under the fork_shared_kv fault (a fork
  // then holds its source's).
  struct KvCache {
    float* k = nullptr;
    float* v = nullptr;
    explicit KvCache(size_t n_floats);
    ~KvCache();
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;
  };
  std::shared_ptr<KvCache> kv_;
  // Scratch for pass_cap_ tokens (scores_: max_ctx_ per thread).
  size_t pass_cap_ = 0;  // tokens the pass scratch holds (size_pass_scratch)
  // The last call appended input embeddings, and the position where that run of
  // embeddings calls began (the image_split_position_reset fault).
  bool embd_last_ = false;
  int32_t embd_run_ = 0;
  std::vector<float> x_, xn_, q_, k_, v_, att_, tmp_, gate_, up_, scores_;
  // MoE scratch: router logits [pass_cap_][n_expert]; each token's k chosen experts
  // and weights in the router's order; the slots (token * k + j) of each expert;
  // the gathered inputs and each slot's expert output [pass_cap_ * k][n_embd].
  std::vector<float> moe_logits_, moe_x_, moe_out_,
      moe_shared_;                       // moe_shared_: [pass_cap_][n_embd]
  std::vector<double> moe_shared_gate_;  // sigmoid(w_shexp . h) per token
  std::vector<int32_t> moe_expert_, moe_slots_, moe_count_, moe_fill_;
  std::vector<double> moe_weight_;
  std::unique_ptr<float[]> multi_scores_;  // attn_queries() x max_ctx_ per thread
  std::vector<int8_t> act_qs_;
  std::vector<float> act_d_, act_s_;
  std::vector<ActRow> act_;
  std::vector<float> greedy_logits_;
  bool taps_on_ = false;
  std::vector<float> taps_;
  void tap(int32_t layer, int point, const float* row);
  // RoPE: layers share a table when their (base, scale) are equal (Gemma 3: one
  // for the local layers, one for the global ones).
  std::vector<int> layer_rope_;                         // [layer] -> table index
  std::vector<std::pair<double, double>> rope_params_;  // [table] (base, scale)
  std::vector<double> rope_cs_;  // [table][token][n_rot/2][cos, sin] of the current chunk
  // YaRN (gpt-oss): each table's frequencies and mscale (touchstone/model/rope_yarn.h),
  // cos and sin multiplied by mscale as ops::rope_with_frequencies; empty otherwise.
  std::vector<touchstone::ops::YarnFrequencies> rope_yarn_;
};

}  // namespace touchstone::cpu_simd
