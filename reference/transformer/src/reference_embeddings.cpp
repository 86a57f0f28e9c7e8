// reference_embeddings.cpp - caller-supplied input embeddings (an image's tokens) in the
// reference forward pass (reference_forward.h, prefill_embeddings).
#include <algorithm>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {

void ReferenceTransformer::prefill_embeddings(std::span<const float> embeddings, int32_t n,
                                              bool bidirectional, bool all_positions,
                                              std::span<float> logits) {
  const ModelConfig& c = w_.config;
  const size_t d = size_t(c.n_embd), V = size_t(c.n_vocab), qd = size_t(c.n_head) * c.head_dim;
  if (n < 1) throw Error("prefill_embeddings: {} embeddings (at least 1)", n);
  if (embeddings.size() != size_t(n) * d)
    throw Error("prefill_embeddings: {} floats for {} embeddings of {}", embeddings.size(), n, d);
  if (pos_ + n > max_ctx_)
    throw Error("KV cache full: {} embeddings at position {}, max context {}", n, pos_, max_ctx_);
  if (logits.size() != (all_positions ? size_t(n) : 1) * V)
    throw Error("logits buffer holds {} floats, expected {}", logits.size(),
                (all_positions ? size_t(n) : 1) * V);
  const int32_t start = pos_, end = pos_ + n;
  std::vector<float> xs(embeddings.begin(), embeddings.end()), qs(size_t(n) * qd);
  const int32_t n_layer = faults_.last_layer_skipped ? c.n_layer - 1 : c.n_layer;
  for (int32_t l = 0; l < n_layer; ++l) {
    for (int32_t t = 0; t < n; ++t) {  // every row's K/V first
      std::copy_n(xs.begin() + long(size_t(t) * d), d, x_.begin());
      attention_qkv(l, start + t);
      std::copy_n(q_.begin(), qd, qs.begin() + long(size_t(t) * qd));
    }
    for (int32_t t = 0; t < n; ++t) {
      std::copy_n(xs.begin() + long(size_t(t) * d), d, x_.begin());
      std::copy_n(qs.begin() + long(size_t(t) * qd), qd, q_.begin());
      attention_out(l, start + t, bidirectional ? end : 0);
      feed_forward(l);
      std::copy_n(x_.begin(), d, xs.begin() + long(size_t(t) * d));
    }
  }
  for (int32_t t = all_positions ? 0 : n - 1; t < n; ++t) {  // the rows asked for
    std::copy_n(xs.begin() + long(size_t(t) * d), d, x_.begin());
    pos_ = start + t;
    finish_position(logits.subspan(all_positions ? size_t(t) * V : 0, V));
  }
  pos_ = end;
  kv_len_ = std::max(kv_len_, pos_);
}

}  // namespace touchstone
