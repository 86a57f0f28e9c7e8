// embeddings_test.cpp - ReferenceTransformer::prefill_embeddings (caller-supplied input
// embeddings, e.g. an image's tokens): run causally on the token embeddings themselves it
// is prefill() bit for bit (the same per-position operations, layer by layer instead of
// token by token); bidirectionally every row of the block changes, the rows before it do
// not, and what follows sees the changed K/V. Agreement with HF transformers on a real
// image block is ci/validate_vision.py's (docs/validation.md, "Vision tower").
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "tiny_family.h"
#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/reference/reference_forward.h"

namespace touchstone {
namespace {

namespace gg = touchstone::gguf;

StoredWeights load(const std::string& arch) {
  testing::TinyOptions o;
  o.arch = arch;
  if (arch == "gemma3") o.sliding_window = 3;  // shorter than the block: the window binds
  gg::testing::TempFile f(testing::tiny_model(o), "embeddings");
  return load_stored_weights(f.path());
}

// Token t's input embedding as forward() makes it: row * embd_scale, rounded to fp32.
std::vector<float> embeddings_of(const StoredWeights& w, const std::vector<int32_t>& tokens) {
  const size_t d = size_t(w.config.n_embd);
  std::vector<float> out, scratch(d);
  for (int32_t t : tokens) {
    const float* e = w.token_embd.row(t, scratch.data());
    for (size_t i = 0; i < d; ++i)
      out.push_back(static_cast<float>(double{e[i]} * w.config.embd_scale));
  }
  return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const std::vector<int32_t> kHead = {1, 7, 3}, kBlock = {30, 12, 5, 9, 2}, kTail = {17, 4};

// Logits of every position: kHead as tokens, kBlock as embeddings (bidirectional or
// not), kTail as tokens.
std::vector<float> run(const StoredWeights& w, bool bidirectional) {
  ReferenceTransformer r(w, 64, 2);
  const size_t V = size_t(w.config.n_vocab);
  std::vector<float> out((kHead.size() + kBlock.size() + kTail.size()) * V);
  r.prefill(kHead, true, std::span(out.data(), kHead.size() * V));
  r.prefill_embeddings(embeddings_of(w, kBlock), int32_t(kBlock.size()), bidirectional, true,
                       std::span(out.data() + kHead.size() * V, kBlock.size() * V));
  r.prefill(kTail, true,
            std::span(out.data() + (kHead.size() + kBlock.size()) * V, kTail.size() * V));
  EXPECT_EQ(r.position(), int32_t(kHead.size() + kBlock.size() + kTail.size()));
  return out;
}

TEST(Embeddings, CausalTokenEmbeddingsArePrefillBitwise) {
  for (const char* arch : {"llama", "qwen3", "gemma3", "phi3"}) {
    SCOPED_TRACE(arch);
    const StoredWeights w = load(arch);
    std::vector<int32_t> all = kHead;
    all.insert(all.end(), kBlock.begin(), kBlock.end());
    all.insert(all.end(), kTail.begin(), kTail.end());
    ReferenceTransformer r(w, 64, 2);
    std::vector<float> want(all.size() * size_t(w.config.n_vocab));
    r.prefill(all, true, want);
    EXPECT_TRUE(same_bits(run(w, false), want));
  }
}

// Rows before the block never change; without a window every later row does. With
// gemma3's window of 3 (tiny_family: both layers sliding) the last token (position 9)
// sees keys 7..9 only, whose K/V come from layer-0 outputs that attended within the
// window as before: it must not change, while position 8 (keys 6..8: row 6 attended row
// 7 bidirectionally in layer 0) must.
TEST(Embeddings, ABidirectionalBlockChangesItsRowsAndWhatFollows) {
  for (const char* arch : {"llama", "gemma3"}) {
    SCOPED_TRACE(arch);
    const StoredWeights w = load(arch);
    const size_t V = size_t(w.config.n_vocab);
    const std::vector<float> causal = run(w, false), bidi = run(w, true);
    auto row = [&](const std::vector<float>& v, size_t p) {
      return std::span(v.data() + p * V, V);
    };
    const size_t n = causal.size() / V;
    for (size_t p = 0; p < n; ++p) {
      const bool windowed_out = std::string(arch) == "gemma3" && p == n - 1;
      const bool changes = p >= kHead.size() && !windowed_out;
      EXPECT_EQ(!same_bits(row(causal, p), row(bidi, p)), changes) << "position " << p;
    }
  }
}

TEST(Embeddings, BadSizesAreErrors) {
  const StoredWeights w = load("llama");
  ReferenceTransformer r(w, 4, 1);
  const size_t d = size_t(w.config.n_embd), V = size_t(w.config.n_vocab);
  std::vector<float> e(5 * d), logits(5 * V);
  EXPECT_THROW(r.prefill_embeddings(std::span(e.data(), 0), 0, true, false, logits), Error);
  EXPECT_THROW(
      r.prefill_embeddings(std::span(e.data(), d + 1), 1, true, false, std::span(logits.data(), V)),
      Error);
  EXPECT_THROW(r.prefill_embeddings(e, 5, true, true, logits), Error);  // 5 > capacity 4
  EXPECT_THROW(r.prefill_embeddings(std::span(e.data(), 2 * d), 2, true, false, logits), Error);
  EXPECT_EQ(r.position(), 0);
}

}  // namespace
}  // namespace touchstone
