#include "touchstone/llama_config.h"

#include "touchstone/error.h"
#include "touchstone/gguf.h"

#include <limits>

namespace touchstone {
namespace {

int32_t positive_i32(const gguf::File& f, const std::string& key, uint64_t v) {
  if (v == 0 || v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("{}: metadata key '{}': value {} out of range (1..2^31-1)", f.path(), key, v);
  }
  return static_cast<int32_t>(v);
}

}  // namespace

LlamaConfig read_llama_config(const gguf::File& f) {
  LlamaConfig c;
  c.architecture = f.get_string("general.architecture");
  if (c.architecture != "llama") {
    throw Error("{}: metadata key 'general.architecture': '{}' is not supported (only 'llama')",
                f.path(), c.architecture);
  }
  const std::string p = c.architecture + ".";
  auto req = [&](const char* k) { return positive_i32(f, p + k, f.get_uint(p + k)); };
  c.n_layer = req("block_count");
  c.n_embd = req("embedding_length");
  c.n_ff = req("feed_forward_length");
  c.n_head = req("attention.head_count");
  c.n_head_kv = c.n_head;
  if (auto v = f.find_uint(p + "attention.head_count_kv")) {
    c.n_head_kv = positive_i32(f, p + "attention.head_count_kv", *v);
  }
  c.n_ctx_train = req("context_length");
  if (auto v = f.find_float(p + "rope.freq_base")) c.rope_freq_base = static_cast<float>(*v);
  c.rms_norm_eps = static_cast<float>(f.get_float(p + "attention.layer_norm_rms_epsilon"));

  if (c.n_embd % c.n_head != 0) {
    throw Error("{}: {}embedding_length {} is not a multiple of attention.head_count {}", f.path(),
                p, c.n_embd, c.n_head);
  }
  if (c.n_head % c.n_head_kv != 0) {
    throw Error("{}: {}attention.head_count {} is not a multiple of head_count_kv {}", f.path(), p,
                c.n_head, c.n_head_kv);
  }
  c.head_dim = c.n_embd / c.n_head;
  c.n_rot = c.head_dim;
  if (auto v = f.find_uint(p + "rope.dimension_count")) {
    c.n_rot = positive_i32(f, p + "rope.dimension_count", *v);
  }
  if (c.n_rot != c.head_dim) {
    throw Error("{}: {}rope.dimension_count {} != head dim {} (partial RoPE is not supported)",
                f.path(), p, c.n_rot, c.head_dim);
  }
  if (!(c.rope_freq_base > 0.0f) || !(c.rms_norm_eps > 0.0f)) {
    throw Error("{}: rope.freq_base ({}) and layer_norm_rms_epsilon ({}) must be positive",
                f.path(), c.rope_freq_base, c.rms_norm_eps);
  }
  if (auto v = f.find_uint(p + "vocab_size")) {
    c.n_vocab = positive_i32(f, p + "vocab_size", *v);
  } else {
    c.n_vocab = positive_i32(f, "tokenizer.ggml.tokens",
                             f.get_string_array("tokenizer.ggml.tokens").size());
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  return c;
}

}  // namespace touchstone
