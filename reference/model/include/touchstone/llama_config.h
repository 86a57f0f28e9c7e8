// touchstone/llama_config.h - Llama-family hyper-parameters read from GGUF metadata.
//
// Keys follow the GGUF spec (ggml/docs/gguf.md, "LLM" section) with the
// architecture prefix taken from general.architecture ("llama").
#pragma once

#include <cstdint>
#include <string>

#include "touchstone/error.h"

namespace touchstone {
namespace gguf {
class File;
}

struct LlamaConfig {
  std::string architecture;         // general.architecture, must be "llama"
  int32_t n_layer = 0;              // llama.block_count
  int32_t n_embd = 0;               // llama.embedding_length (hidden size d)
  int32_t n_ff = 0;                 // llama.feed_forward_length (SwiGLU inner size)
  int32_t n_head = 0;               // llama.attention.head_count (query heads)
  int32_t n_head_kv = 0;            // llama.attention.head_count_kv (GQA groups; == n_head for MHA)
  int32_t head_dim = 0;             // n_embd / n_head
  int32_t n_rot = 0;                // llama.rope.dimension_count (default head_dim)
  int32_t n_ctx_train = 0;          // llama.context_length
  int32_t n_vocab = 0;              // llama.vocab_size, else length of tokenizer.ggml.tokens
  float rope_freq_base = 10000.0f;  // llama.rope.freq_base
  float rms_norm_eps = 1e-5f;       // llama.attention.layer_norm_rms_epsilon
  bool tied_embeddings = false;     // true when output.weight is absent (LM head = token_embd)
};

// The file describes a model this reference does not compute (an unknown
// architecture key such as llama.rope.scaling.type, an extra tensor such as
// rope_freqs.weight or a bias): computing it while ignoring that part would
// silently give the wrong model, so it is refused (TS_ERR_UNSUPPORTED).
class UnsupportedModel : public Error {
 public:
  using Error::Error;
};

// Reads and validates the config. Throws touchstone::Error naming the file and
// the key when a key is missing, has the wrong type or an impossible value
// (e.g. n_head not dividing n_embd, n_head_kv not dividing n_head), and
// UnsupportedModel naming the first "llama.*" metadata key outside the known
// set, or the first tensor that is not one of the weights the forward pass
// reads (token_embd, output_norm, output, blk.N.{attn_norm, attn_q, attn_k,
// attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}.weight).
LlamaConfig read_llama_config(const gguf::File& file);

}  // namespace touchstone
