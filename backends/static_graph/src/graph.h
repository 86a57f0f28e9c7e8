// graph.h - builds the whole-model step graph of a decoder-only model (every
// family of touchstone::ModelConfig, see ModelDims) as MLIR text (TOSA 1.0 +
// func), with static shapes.
//
// One graph = one (T, W) pair: T tokens processed at positions pos..pos+T-1
// (T = 1 is the decode step, T > 1 a prefill bucket), attention over the key
// window [0, W) of the KV cache (W <= capacity). Signature (all tensors):
//
//   func.func @step(%tokens: tensor<1xTxi32>, %pos: tensor<1x1xi32>,
//                   %tap_row: tensor<1x1xi32>,                     row (< T) whose layer taps are
//                   returned %rope_cos[.k], %rope_sin[.k]: tensor<1xCAPx(n_rot/2)xf32>  (k: RoPE
//                   table, k >= 1 named) <weights ...>, %k_cache.<l>: tensor<1x(KVH*hd*CAP)x1xf32>,
//                   K transposed: [KVH][hd][CAP] %v_cache.<l>: tensor<1x(KVH*CAP)xhdxf32>)      V
//                   rows:       [KVH][CAP][hd]
//       -> (tensor<TxVOCABxf32> logits, k_cache', v_cache', [argmax tensor<Txi32>],
//           taps tensor<1x(3L)xdxf32>)     [l*3 + point][d], ABI v4 TS_TAP_* order, row tap_row
//
// The caches are returned after tosa.scatter writes of the T new entries; the
// lowering (one-shot bufferize + drop-equivalent-buffer-results) turns them
// into buffers updated in place (no copy), see compiler.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace touchstone::static_graph {

enum class WeightMode { FullPrecision, Quantized };

// How one weight matrix enters the graph.
enum class MatrixFormat {
  F32,   // fp32 [1][in][out] (transposed at load)
  Q4_1,  // qs i8 [nb][16][out], d f16 [nb][1][out], m f16 [nb][1][out]
  Q4_0,  // qs i8 [nb][16][out], d f16 [nb][1][out]
  Q8_0,  // qs i8 [nb][32][out], d f16 [nb][1][out] (also Q5_0 blocks: q - 16 as i8)
  // Q4_K: 4-bit quants of each 32-row sub-block, its scale d*sc and its
  // -dmin*m computed once in fp32 at load (exact: 11-bit x 6-bit products).
  Q4_1F,  // qs i8 [nb][16][out], d f32 [nb][1][out], m f32 [nb][1][out]
  // Q6_K: q - 32 as i8, the 16-row sub-block's scale d*sc in fp32 (exact).
  Q8_16F,  // qs i8 [n16][16][out], d f32 [n16][1][out] (n16 = in / 16)
  // Q5_1: the 5-bit q as i8 with the block's f16 d and m (q*d + m).
  Q8_1,  // qs i8 [nb][32][out], d f16 [nb][1][out], m f16 [nb][1][out]
  // Q5_K: the 5-bit q as i8, per 32-row sub-block d*sc and -dmin*m in fp32 (exact).
  Q8_1F,  // qs i8 [nb][32][out], d f32 [nb][1][out], m f32 [nb][1][out]
};
// Rows of one block of a format (F32: the 32-row unit of the slicing fault).
inline int64_t block_rows(MatrixFormat f) { return f == MatrixFormat::Q8_16F ? 16 : 32; }

// The model as the graph sees it: sizes plus the family features of
// touchstone::ModelConfig (model_config.h; formulas in reference_forward.cpp).
// The defaults beyond rms_eps are a plain Llama.
struct ModelDims {
  int32_t n_layer = 0, n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_vocab = 0;
  float rms_eps = 1e-5f;
  int32_t n_rot = 0;                    // rotary dims per head (0: head_dim); the rest pass through
  bool neox_rope = false;               // pairs (i, i + n_rot/2), else interleaved (2i, 2i+1)
  bool qkv_bias = false;                // q, k, v += attn_{q,k,v}.bias ([1, out] f32)
  bool qk_norm = false;                 // RMSNorm per head of q and k (attn_{q,k}_norm, [1, hd])
  bool post_norms = false;              // RMSNorm of the attention / FFN output before its add
  bool geglu = false;                   // gate tanh-GELU (GeGLU), else SiLU (SwiGLU)
  double embd_scale = 1.0;              // x = token_embd[token] * embd_scale
  double attn_scale = 0.0;              // attention score multiplier (0: 1/sqrt(head_dim))
  double final_logit_softcap = 0.0;     // 0: none; else logits = cap * tanh(logits / cap)
  int32_t n_rope_tables = 1;            // distinct RoPE (base, scale) pairs: rope_cos[.k] inputs
  std::vector<int32_t> layer_rope{};    // per layer: its RoPE table (empty: table 0 everywhere)
  std::vector<int32_t> layer_window{};  // per layer: sliding window in positions (0 or empty: none)
  // Mixture of experts (n_expert > 0; touchstone::MoeConfig): router logits
  // r = h . ffn_gate_inp [d, n_expert] (fp32 on both paths), the n_expert_used largest
  // (equal: lower index), weights exp(r_e - max) / sum (the sum over every expert, or
  // over the selected ones when norm_topk: softmax then top-k, renormalised or not),
  // experts of width n_ff_exp; a shared expert of width n_ff_shexp (0: none) scaled
  // by sigmoid(ffn_gate_inp_shexp . h).
  // gpt-oss's router (top k of the logits, then the softmax over the k) is the same
  // maths as softmax, top k, renormalised: norm_topk.
  int32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  bool norm_topk = true;
  // gpt-oss: attn_output.bias; a sink logit per head in every softmax's denominator
  // (attn_sinks [1, H]); router and expert biases (ffn_gate_inp.bias [1, E],
  // ffn_{gate,up}_exps.bias [1, E * n_ff_exp], ffn_down_exps.bias [1, E * d]); the
  // clamped SwiGLU (u + 1) * g' * sigmoid(1.702 g'), g' = min(g, 7), u clamped to +-7.
  bool attn_out_bias = false, attn_sinks = false, moe_biases = false, swiglu_oai = false;
  int32_t rot() const { return n_rot > 0 ? n_rot : head_dim; }
};

// The weight matrices of a layer, in the order of GraphSpec::layer_formats (kLayerMatrices
// entries per layer) and of a layer function's parameters. In a mixture-of-experts layer
// ffn_gate/up/down are the experts' matrices stacked (GGUF ffn_{gate,up,down}_exps),
// ffn_gate_inp the router and the last three the shared expert's; a dense layer has the
// first seven only.
enum LayerMatrix : int {
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kFfnGate,
  kFfnUp,
  kFfnDown,
  kFfnGateInp,
  kFfnGateShexp,
  kFfnUpShexp,
  kFfnDownShexp,
  kLayerMatrices
};

// Shape of layer matrix k as y [T, out] = x [T, in] . M: `count` matrices stacked (the
// experts; 1 otherwise); count 0: the model has no such matrix.
struct MatrixShape {
  int64_t in = 0, out = 0, count = 0;
};
MatrixShape layer_matrix_shape(const ModelDims& dims, int k);
// Graph argument stem of layer matrix k ("attn_q", "ffn_gate_exps", ...): its GGUF
// tensor name without "blk.N." and ".weight".
std::string layer_matrix_name(const ModelDims& dims, int k);

// Faults realised in the graph itself (test only: ts_session_options.fault, see
// touchstone::Faults and docs/backends/static_graph.md#fault-catalog). Each one
// changes the graph text, hence the on-disk cache key; the default (no fault)
// builds exactly the text of a graph without this struct.
struct GraphFaults {
  bool rope_layout = false;         // NeoX pairs (j, j + hd/2) instead of interleaved (2j, 2j+1)
  bool kv_off_by_one = false;       // the mask hides the newest key (pos + t) when pos + t > 0
  bool kv_write_next = false;       // K/V of position p scattered to slot p + 1 (mod capacity)
  bool gqa_mapping = false;         // query head h reads KV head h % n_head_kv
  bool attention_scale = false;     // scores * 1/head_dim instead of 1/sqrt(head_dim)
  bool softmax_no_max = false;      // exp(s) in fp32 without subtracting the row maximum
  double rms_eps_scale = 1.0;       // every RMSNorm epsilon times this
  bool fp16_accumulation = false;   // every weight matmul's output rounded through f16
  bool causal_mask = false;         // every row of a prefill bucket sees the whole bucket
  bool last_layer_skipped = false;  // the last layer is not called
  bool kv_len_input = false;        // rewind_noop: an extra input `kv_len` (i32 [1, 1]);
                                    // keys j < kv_len are visible from every row too
  int32_t reduction_slices = 1;     // thread_order_reduction: each weight matmul split along
                                    // its input dim into this many slices (whole 32-blocks),
                                    // partial products summed in fp32 in slice order
  // Mixture-of-experts faults (the reference's, touchstone/model/faults.h):
  bool moe_runner_up = false;              // the k-th pick replaced by the (k+1)-th
  int32_t moe_renormalise = -1;            // -1: the model's rule; 0 / 1: the weights divided by
                                           // the sum over every expert / over the k picked
                                           // (moe_renorm_skipped, moe_softmax_order)
  bool moe_shared_expert_dropped = false;  // the shared expert not added
  bool attention_sinks_ignored = false;    // the sink logits left out of the softmax
  bool any() const {
    return rope_layout || kv_off_by_one || kv_write_next || gqa_mapping || attention_scale ||
           softmax_no_max || rms_eps_scale != 1.0 || fp16_accumulation || causal_mask ||
           last_layer_skipped || kv_len_input || reduction_slices > 1 || moe_runner_up ||
           moe_renormalise >= 0 || moe_shared_expert_dropped || attention_sinks_ignored;
  }
};

struct GraphSpec {
  int32_t T = 1;         // tokens per call (padded bucket size)
  int32_t W = 0;         // attention window (keys 0..W-1)
  int32_t capacity = 0;  // KV cache capacity (positions)
  WeightMode mode = WeightMode::FullPrecision;
  // Per-matrix formats in quantized mode (index: layer * kLayerMatrices + LayerMatrix;
  // entries of matrices the model lacks are ignored; the router is always F32),
  // the embedding's (Q8_0: rows gathered and dequantized in the graph; F32) and
  // the LM head's (any format; unset: embd_format).
  std::vector<MatrixFormat> layer_formats;
  MatrixFormat embd_format = MatrixFormat::F32;
  std::optional<MatrixFormat> head_format;
  bool argmax = false;  // also return argmax token ids (tensor<Txi32>)
  // ABI v8 input embeddings: the graph takes "embd" [1, T, n_embd] f32, the rows as
  // given (no embedding scale, as the reference's prefill_embeddings), instead of
  // "tokens". block: the T rows are one block that attends both ways (Gemma 3's
  // image): every row sees the keys up to pos + T - 1, its sliding window as a text
  // row's (the reference's attention_out with visible_end).
  bool embeddings = false;
  bool block = false;
  GraphFaults faults;  // test only; default: none
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

// The f32 vectors [1, n] of every layer beyond attn_norm / ffn_norm that dims'
// features need, in the order of the layer's arguments (after its matrices):
// attn_{q,k,v}.bias, attn_{q,k}_norm, post_attention_norm, post_ffw_norm. The
// graph argument is "blk.<l>." + name.
struct VectorArg {
  std::string name;
  int64_t n = 0;
};
std::vector<VectorArg> layer_vectors(const ModelDims& dims);

}  // namespace touchstone::static_graph
