// touchstone/model/model_weights.h - every weight of a supported model, dequantized once to fp32.
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
#include <string>
#include <vector>

#include "touchstone/model/model_config.h"

namespace touchstone {
namespace gguf {
class File;
}

struct LayerWeights {
  std::vector<float> attn_norm;   // [n_embd]                    blk.N.attn_norm.weight
  std::vector<float> wq;          // [n_head*head_dim][n_embd]   blk.N.attn_q.weight
  std::vector<float> wk;          // [n_head_kv*head_dim][n_embd] blk.N.attn_k.weight
  std::vector<float> wv;          // [n_head_kv*head_dim][n_embd] blk.N.attn_v.weight
  std::vector<float> bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim]  blk.N.attn_{q,k,v}.bias (Qwen2)
  std::vector<float> q_norm, k_norm;  // [head_dim]                  blk.N.attn_{q,k}_norm.weight
  std::vector<float> wo;              // [n_embd][n_head*head_dim]   blk.N.attn_output.weight
  std::vector<float> bo;              // [n_embd]          blk.N.attn_output.bias (gpt-oss)
  std::vector<float> sinks;           // [n_head]          blk.N.attn_sinks.weight (gpt-oss)
  std::vector<float> post_attn_norm;  // [n_embd] blk.N.post_attention_norm.weight
  std::vector<float> ffn_norm;        // [n_embd]                    blk.N.ffn_norm.weight
  std::vector<float> w_gate;          // [n_ff][n_embd]              blk.N.ffn_gate.weight
  std::vector<float> w_up;            // [n_ff][n_embd]              blk.N.ffn_up.weight
  std::vector<float> w_down;          // [n_embd][n_ff]              blk.N.ffn_down.weight
  std::vector<float> post_ffn_norm;   // [n_embd]                    blk.N.post_ffw_norm.weight
  std::vector<float> ffn_gate_inp;    // [n_expert][n_embd]          blk.N.ffn_gate_inp.weight
  std::vector<float> gate_exps;       // [n_expert][n_ff_exp][n_embd] blk.N.ffn_gate_exps.weight
  std::vector<float> up_exps;         // [n_expert][n_ff_exp][n_embd] blk.N.ffn_up_exps.weight
  std::vector<float> down_exps;       // [n_expert][n_embd][n_ff_exp] blk.N.ffn_down_exps.weight
  // gpt-oss: blk.N.ffn_gate_inp.bias [n_expert], ffn_{gate,up}_exps.bias [n_expert][n_ff_exp],
  // ffn_down_exps.bias [n_expert][n_embd] (ggml shapes {n_out, n_expert}).
  std::vector<float> gate_inp_b, gate_exps_b, up_exps_b, down_exps_b;
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> token_embd;   // [n_vocab][n_embd]  token_embd.weight
  std::vector<float> output_norm;  // [n_embd]           output_norm.weight
  std::vector<float> output;       // [n_vocab][n_embd]  output.weight (empty when tied)
  std::vector<float> rope_freqs;   // [n_rot/2]          rope_freqs.weight (empty when absent)
  std::vector<LayerWeights> layers;

  // LM head matrix: output.weight, or token_embd.weight when the embeddings are tied.
  const std::vector<float>& lm_head() const { return config.tied_embeddings ? token_embd : output; }
};

// Reads the config (read_model_config: unsupported models are refused) and loads and
// dequantizes every tensor. Throws touchstone::Error naming the file and tensor when
// one is missing, has an unexpected shape, or an unsupported type.
ModelWeights load_model_weights(const gguf::File& file);

}  // namespace touchstone
