#include "touchstone/llama_config.h"

#include "touchstone/error.h"
#include "touchstone/gguf.h"

#include <cstdio>
#include <limits>
#include <set>

namespace touchstone {
namespace {

int32_t positive_i32(const gguf::File& f, const std::string& key, uint64_t v) {
  if (v == 0 || v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    throw Error("{}: metadata key '{}': value {} out of range (1..2^31-1)", f.path(), key, v);
  }
  return static_cast<int32_t>(v);
}

// "llama.*" keys the forward pass reads or that cannot change what it computes
// (GGUF spec, "LLM" section). Anything else (rope.scaling.*, expert_count,
// attention.sliding_window, ...) changes the model, so it is refused by name.
const std::set<std::string> kKnownKeys = {
    "block_count",         "context_length",       "embedding_length",
    "feed_forward_length", "attention.head_count", "attention.head_count_kv",
    "rope.freq_base",      "rope.dimension_count", "attention.layer_norm_rms_epsilon",
    "vocab_size",          "attention.key_length", "attention.value_length"};

void refuse_unknown_keys(const gguf::File& f, const std::string& prefix) {
  for (const auto& [key, value] : f.metadata()) {
    if (key.rfind(prefix, 0) == 0 && !kKnownKeys.count(key.substr(prefix.size()))) {
      throw UnsupportedModel(
          "{}: metadata key '{}' is not supported by the reference (computing the model without "
          "it would be silently wrong)",
          f.path(), key);
    }
  }
}

// Every tensor must be one the forward pass reads (rope_freqs.weight, biases,
// extra norms are refused, not ignored).
void refuse_unknown_tensors(const gguf::File& f, int32_t n_layer) {
  static const std::set<std::string> kPerLayer = {"attn_norm", "attn_q",      "attn_k",
                                                  "attn_v",    "attn_output", "ffn_norm",
                                                  "ffn_gate",  "ffn_up",      "ffn_down"};
  for (const gguf::TensorInfo& t : f.tensors()) {
    const std::string& n = t.name;
    bool known = n == "token_embd.weight" || n == "output_norm.weight" || n == "output.weight";
    int layer = -1, used = 0;
    char part[64] = {};
    if (!known && std::sscanf(n.c_str(), "blk.%d.%63[a-z_].weight%n", &layer, part, &used) == 2 &&
        size_t(used) == n.size()) {
      known = layer >= 0 && layer < n_layer && kPerLayer.count(part);
    }
    if (!known) {
      throw UnsupportedModel(
          "{}: tensor '{}' is not supported by the reference (computing the model without it "
          "would be silently wrong)",
          f.path(), n);
    }
  }
}

}  // namespace

LlamaConfig read_llama_config(const gguf::File& f) {
  LlamaConfig c;
  c.architecture = f.get_string("general.architecture");
  if (c.architecture != "llama") {
    throw UnsupportedModel(
        "{}: metadata key 'general.architecture': '{}' is not supported (only 'llama')", f.path(),
        c.architecture);
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
  for (const char* k : {"attention.key_length", "attention.value_length"}) {
    if (auto v = f.find_uint(p + k); v && *v != uint64_t(c.head_dim)) {
      throw UnsupportedModel("{}: {}{} {} != embedding_length / head_count {} (not supported)",
                             f.path(), p, k, *v, c.head_dim);
    }
  }
  if (c.n_rot != c.head_dim) {
    throw UnsupportedModel(
        "{}: {}rope.dimension_count {} != head dim {} (partial RoPE is not supported)", f.path(), p,
        c.n_rot, c.head_dim);
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
  refuse_unknown_keys(f, p);
  refuse_unknown_tensors(f, c.n_layer);
  return c;
}

}  // namespace touchstone
