// greedy.cpp - mask helpers (membership, masking, count, FNV-1a digest) and constrained greedy
// decoding.
#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "touchstone/grammar/oracle.h"

namespace touchstone::grammar {

bool mask_allows(std::span<const uint32_t> mask, int32_t token) {
  if (token < 0 || size_t(token) / 32 >= mask.size()) return false;
  return ((mask[size_t(token) / 32] >> (token % 32)) & 1u) != 0;
}

size_t apply_mask(std::span<const uint32_t> mask, std::span<float> logits) {
  if (mask.size() != (logits.size() + 31) / 32) {
    throw std::invalid_argument(
        fmt::format("grammar apply_mask: {} mask words for {} logits", mask.size(), logits.size()));
  }
  size_t allowed = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (mask_allows(mask, int32_t(i))) {
      ++allowed;
    } else {
      logits[i] = -std::numeric_limits<float>::infinity();
    }
  }
  return allowed;
}

size_t mask_count(std::span<const uint32_t> mask) {
  size_t n = 0;
  for (uint32_t w : mask) n += size_t(std::popcount(w));
  return n;
}

uint64_t mask_digest(std::span<const uint32_t> mask) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t w : mask) {
    for (int b = 0; b < 4; ++b) {
      h ^= (w >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

namespace {

// The allowed token with the largest logit, the lowest id on ties; -1 when no
// allowed token has a non-NaN logit.
int32_t masked_argmax(std::span<const float> logits, std::span<const uint32_t> mask) {
  int32_t best = -1;
  for (size_t w = 0; w < mask.size(); ++w) {
    for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const auto id = static_cast<int32_t>(w * 32 + size_t(std::countr_zero(bits)));
      const float x = logits[size_t(id)];
      if (std::isnan(x)) continue;
      if (best < 0 || x > logits[size_t(best)]) best = id;
    }
  }
  return best;
}

}  // namespace

ConstrainedResult constrained_greedy(GrammarOracle& oracle, const NextLogits& next_logits,
                                     int max_tokens) {
  ConstrainedResult r;
  const GrammarVocab& vocab = oracle.vocab();
  int32_t fed = -1;
  while (int(r.tokens.size()) < max_tokens) {
    if (oracle.is_completed()) {
      r.stop = ConstrainedResult::Stop::completed;
      return r;
    }
    const std::vector<float> logits = next_logits(fed);
    if (logits.size() != size_t(vocab.n_vocab())) {
      throw std::invalid_argument(fmt::format("constrained_greedy: {} logits, n_vocab is {}",
                                              logits.size(), vocab.n_vocab()));
    }
    const int32_t tok = masked_argmax(logits, oracle.allowed_mask());
    if (tok < 0 || !oracle.accept(tok)) {
      throw GrammarError("grammar \"{}\" ({}): no token allowed after {} tokens",
                         oracle.spec().name, grammar_kind_name(oracle.spec().kind),
                         r.tokens.size());
    }
    r.tokens.push_back(tok);
    if (vocab.is_stop(tok)) {
      r.stop = ConstrainedResult::Stop::stop_token;
      return r;
    }
    fed = tok;
  }
  r.stop = oracle.is_completed() ? ConstrainedResult::Stop::completed
                                 : ConstrainedResult::Stop::max_tokens;
  return r;
}

}  // namespace touchstone::grammar
