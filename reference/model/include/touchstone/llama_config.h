// touchstone/llama_config.h - Llama-family hyper-parameters read from GGUF metadata.
//
// Keys follow the GGUF spec (ggml/docs/gguf.md, "LLM" section) with the
// architecture prefix taken from general.architecture ("llama").
#pragma once

#include <cstdint>
#include <string>

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

// Reads and validates the config. Throws touchstone::Error naming the file and
// the key when a key is missing, has the wrong type or an impossible value
// (e.g. n_head not dividing n_embd, n_head_kv not dividing n_head).
LlamaConfig read_llama_config(const gguf::File& file);

}  // namespace touchstone
