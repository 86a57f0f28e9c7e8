// touchstone/model/model_weights.h - every weight of a supported model, in one of two forms:
// ModelWeights, every tensor dequantized once to fp32 (what a backend that computes with
// fp32 weights uploads or packs), and StoredWeights, the matrices read in place from the
// GGUF file as stored (touchstone/model/weight_matrix.h: a row dequantized when it is
// used, the vectors in fp32), so that resident memory is about the file's size. The two
// are one template over the matrix type, filled by one loader: the same tensors, names,
// shapes and checks, and the same values at every index.
//
//
// Matrices are row-major [n_out][n_in] (ggml stores a 2-D tensor with shape
// {n_in, n_out}: ne[0] = n_in is contiguous), so y[o] = sum_i W[o*n_in + i] x[i].
//
// Q/K rows are kept exactly as stored in the GGUF file. For the "llama" family,
// llama.cpp's HF->GGUF converter permutes the rows of attn_q / attn_k inside every
// head so that HF's NeoX "rotate_half" RoPE (pairs (i, i + d/2)) becomes the
// interleaved RoPE of the original Meta code (pairs (2i, 2i+1)); the forward pass
// applies interleaved RoPE there (ModelConfig::rope_style) and q.k is invariant under
// the same row permutation of q and k. Other families are stored unpermuted (NeoX).
//
// gpt-oss's pre-FFN norm is stored as blk.N.post_attention_norm.weight (ffn_norm_tensor)
// and loaded into ffn_norm. Its experts may be MXFP4 (dequantized as ggml does).
//
// Fused Phi-3 tensors are split at load: attn_qkv rows [q | k | v] into wq, wk, wv;
// ffn_up rows [gate | up] (HF Phi3MLP: gate, up = gate_up_proj(x).chunk(2)) into
// w_gate, w_up. Optional vectors are empty when the config does not use them.
//
// Mixture-of-experts layers (ModelConfig::moe) have no w_gate / w_up / w_down; their
// experts are GGUF 3-D tensors, ggml shape {n_in, n_out, n_expert}: expert e's matrix is
// the row-major [n_out][n_in] block at offset e * n_out * n_in (the converter stacks
// HF's per-expert matrices along the last ggml axis, convert_hf_to_gguf.py).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "touchstone/model/model_config.h"
#include "touchstone/model/weight_matrix.h"

namespace touchstone {
namespace gguf {
class File;
}

// Matrix: std::vector<float> (row-major fp32) or WeightMatrix (as stored).
template <class Matrix>
struct BasicLayerWeights {
  std::vector<float> attn_norm;   // [n_embd]                    blk.N.attn_norm.weight
  Matrix wq;                      // [n_head*head_dim][n_embd]   blk.N.attn_q.weight
  Matrix wk;                      // [n_head_kv*head_dim][n_embd] blk.N.attn_k.weight
  Matrix wv;                      // [n_head_kv*head_dim][n_embd] blk.N.attn_v.weight
  std::vector<float> bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim]  blk.N.attn_{q,k,v}.bias (Qwen2)
  std::vector<float> q_norm, k_norm;  // [head_dim]                  blk.N.attn_{q,k}_norm.weight
  Matrix wo;                          // [n_embd][n_head*head_dim]   blk.N.attn_output.weight
  std::vector<float> bo;              // [n_embd]          blk.N.attn_output.bias (gpt-oss)
  std::vector<float> sinks;           // [n_head]          blk.N.attn_sinks.weight (gpt-oss)
  std::vector<float> post_attn_norm;  // [n_embd] blk.N.post_attention_norm.weight
  std::vector<float> ffn_norm;        // [n_embd]                    blk.N.ffn_norm.weight
  Matrix w_gate;                      // [n_ff][n_embd]              blk.N.ffn_gate.weight
  Matrix w_up;                        // [n_ff][n_embd]              blk.N.ffn_up.weight
  Matrix w_down;                      // [n_embd][n_ff]              blk.N.ffn_down.weight
  std::vector<float> post_ffn_norm;   // [n_embd]                    blk.N.post_ffw_norm.weight
  Matrix ffn_gate_inp;                // [n_expert][n_embd]          blk.N.ffn_gate_inp.weight
  Matrix gate_exps;                   // [n_expert][n_ff_exp][n_embd] blk.N.ffn_gate_exps.weight
  Matrix up_exps;                     // [n_expert][n_ff_exp][n_embd] blk.N.ffn_up_exps.weight
  Matrix down_exps;                   // [n_expert][n_embd][n_ff_exp] blk.N.ffn_down_exps.weight
  // gpt-oss: blk.N.ffn_gate_inp.bias [n_expert], ffn_{gate,up}_exps.bias [n_expert][n_ff_exp],
  // ffn_down_exps.bias [n_expert][n_embd] (ggml shapes {n_out, n_expert}).
  std::vector<float> gate_inp_b, gate_exps_b, up_exps_b, down_exps_b;
  // Shared expert (qwen2moe: MoeConfig::n_ff_shexp > 0):
  std::vector<float> gate_inp_shexp;  // [n_embd]                blk.N.ffn_gate_inp_shexp.weight
  Matrix gate_shexp;                  // [n_ff_shexp][n_embd]    blk.N.ffn_gate_shexp.weight
  Matrix up_shexp;                    // [n_ff_shexp][n_embd]    blk.N.ffn_up_shexp.weight
  Matrix down_shexp;                  // [n_embd][n_ff_shexp]    blk.N.ffn_down_shexp.weight
};

template <class Matrix>
struct BasicModelWeights {
  ModelConfig config;
  Matrix token_embd;               // [n_vocab][n_embd]  token_embd.weight
  std::vector<float> output_norm;  // [n_embd]           output_norm.weight
  Matrix output;                   // [n_vocab][n_embd]  output.weight (empty when tied)
  std::vector<float> rope_freqs;   // [n_rot/2]          rope_freqs.weight (empty when absent)
  std::vector<BasicLayerWeights<Matrix>> layers;
  // StoredWeights: the file its matrices point into, kept alive with them (null for
  // ModelWeights).
  std::shared_ptr<const gguf::File> file;

  // LM head matrix: output.weight, or token_embd.weight when the embeddings are tied.
  const Matrix& lm_head() const { return config.tied_embeddings ? token_embd : output; }
};

using LayerWeights = BasicLayerWeights<std::vector<float>>;
using ModelWeights = BasicModelWeights<std::vector<float>>;
using StoredLayerWeights = BasicLayerWeights<WeightMatrix>;
using StoredWeights = BasicModelWeights<WeightMatrix>;

// Reads the config (read_model_config: unsupported models are refused) and loads and
// dequantizes every tensor. Throws touchstone::Error naming the file and tensor when
// one is missing, has an unexpected shape, or an unsupported type.
ModelWeights load_model_weights(const gguf::File& file);

// The same config and tensors (and the same errors) with the matrices kept as stored in
// `file`, which the result holds (StoredWeights::file). The values at every index are
// load_model_weights()'s; resident memory is the file's (gguf::File reads it into private
// memory) plus the fp32 vectors. Throws touchstone::Error also for a null file.
StoredWeights load_stored_weights(std::shared_ptr<const gguf::File> file);
// gguf::File::open(path), then load_stored_weights().
StoredWeights load_stored_weights(const std::string& path);

// Bytes the matrices of w would take dequantized to fp32 (4 per weight).
uint64_t fp32_matrix_bytes(const StoredWeights& w);
// Replaces every matrix of w by its expanded() fp32 copy and releases the file: the same
// values (bit for bit), read without dequantizing, in 4 bytes per weight (what a small
// model's reference runs with to go faster; touchstone/reference docs "Weight residency").
void expand_to_fp32(StoredWeights& w);

// F32 WeightMatrix views of w's matrices and copies of its vectors and config, for
// weights made or changed in memory (tests). w must outlive the result and its matrices
// must keep their sizes.
StoredWeights stored_view(const ModelWeights& w);

}  // namespace touchstone
