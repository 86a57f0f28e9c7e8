// GoldenFile lookups and validation (shared by the writer and the reader).
// Layout: docs/golden-format.md.
#include "touchstone/golden/golden.h"

#include <fmt/format.h>

#include <cstdint>
#include <set>

#include "touchstone/common/error.h"

namespace touchstone {

// ---------------------------------------------------------------------------
// GoldenFile lookups

const GoldenCase* GoldenFile::find_case(std::string_view n) const {
  for (const auto& c : cases)
    if (c.name == n) return &c;
  return nullptr;
}

const GoldenScoring* GoldenFile::find_scoring(std::string_view n) const {
  for (const auto& s : scoring)
    if (s.name == n) return &s;
  return nullptr;
}

// ---------------------------------------------------------------------------
// Validation

namespace {

void check_name(const std::string& where, const char* kind, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    throw Error("{}: invalid {} name '{}': must be non-empty, not '.'/'..', without '/' or NUL",
                where, kind, name);
}

void check_attr_string(const std::string& where, const char* attr, const std::string& v) {
  if (v.find('\0') != std::string::npos)
    throw Error("{}: attribute {}: contains a NUL byte", where, attr);
}

void check_size(const std::string& where, const std::string& obj, size_t actual, uint64_t expected,
                const std::string& formula) {
  if (actual != expected)
    throw Error("{}: {}: has {} elements, expected {} = {}", where, obj, actual, formula, expected);
}

void check_ids(const std::string& where, const std::string& obj, const std::vector<int32_t>& ids,
               int32_t n_vocab) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= n_vocab)
      throw Error("{}: {}[{}]: token id {} out of range [0, {})", where, obj, i, ids[i], n_vocab);
}

void check_vocab_k(const std::string& where, const std::string& obj, int32_t n_vocab,
                   int32_t top_k) {
  if (n_vocab < 1) throw Error("{}: {}: attribute n_vocab = {} must be >= 1", where, obj, n_vocab);
  if (top_k < 0 || top_k > n_vocab)
    throw Error("{}: {}: attribute top_k = {} must be in [0, n_vocab = {}]", where, obj, top_k,
                n_vocab);
}

uint64_t mul(uint64_t a, uint64_t b) { return a * b; }  // operands < 2^32 each: no overflow

void validate_taps(const std::string& where, const std::string& obj, const GoldenCase& c,
                   int format_version) {
  if (c.tap_steps.empty()) {
    if (!c.taps.empty()) throw Error("{}: {}/taps: present without tap_steps", where, obj);
    return;
  }
  if (format_version < 2)
    throw Error("{}: {}: layer taps need format_version 2, the file says {}", where, obj,
                format_version);
  if (c.tap_layers < 1 || c.tap_dim < 1)
    throw Error("{}: {}/taps: tap_layers = {} and tap_dim = {} must be >= 1", where, obj,
                c.tap_layers, c.tap_dim);
  for (size_t i = 0; i < c.tap_steps.size(); ++i) {
    const int32_t s = c.tap_steps[i];
    if (s < 0 || size_t(s) >= c.greedy_ids.size() || (i > 0 && s <= c.tap_steps[i - 1]))
      throw Error("{}: {}/tap_steps[{}] = {}: must be ascending and in [0, G = {})", where, obj, i,
                  s, c.greedy_ids.size());
  }
  check_size(where, obj + "/taps", c.taps.size(), mul(c.tap_steps.size(), c.tap_record_size()),
             fmt::format("T * layers * {} * dim = {} * {} * {} * {}", kTapPoints,
                         c.tap_steps.size(), c.tap_layers, kTapPoints, c.tap_dim));
}

void validate_grammar(const std::string& where, const std::string& obj, const GoldenCase& c) {
  if (!c.has_grammar()) {
    if (!c.allowed_masks.empty())
      throw Error("{}: {}/allowed_masks: present without a grammar", where, obj);
    return;
  }
  if (c.grammar_text.empty()) throw Error("{}: {}/grammar_text: empty", where, obj);
  check_size(where, obj + "/allowed_masks", c.allowed_masks.size(),
             mul(c.greedy_ids.size(), c.mask_words()),
             fmt::format("G * ceil(n_vocab / 32) = {} * {}", c.greedy_ids.size(), c.mask_words()));
}

// image_frames (format 4): non-decreasing positions in [image_at, P), the first
// image_at, dividing the image's rows evenly.
void validate_frames(const std::string& where, const std::string& obj, const GoldenCase& c,
                     int format_version) {
  const std::vector<int32_t>& f = c.image_frames;
  if (f.empty()) return;
  if (format_version < 4)
    throw Error("{}: {}/image_frames: needs format_version 4, the file says {}", where, obj,
                format_version);
  if (f.size() < 2 || f[0] != c.image_at || c.image_tokens % int32_t(f.size()) != 0)
    throw Error(
        "{}: {}/image_frames: {} frames, the first at {}: expected at least 2, the "
        "first at image_at = {}, dividing image_tokens = {}",
        where, obj, f.size(), f[0], c.image_at, c.image_tokens);
  for (size_t i = 1; i < f.size(); ++i)
    if (f[i] < f[i - 1] || size_t(f[i]) >= c.prompt_ids.size())
      throw Error("{}: {}/image_frames[{}] = {}: must be in [{}, P = {})", where, obj, i, f[i],
                  f[i - 1], c.prompt_ids.size());
}

void validate_image(const std::string& where, const std::string& obj, const GoldenCase& c,
                    int format_version) {
  if (!c.has_image()) {
    if (!c.image_embeddings.empty() || c.image_at != 0)
      throw Error("{}: {}/image_embeddings: present without image_tokens", where, obj);
    return;
  }
  if (format_version < 3)
    throw Error("{}: {}: an image needs format_version 3, the file says {}", where, obj,
                format_version);
  if (c.image_at < 1 || size_t(c.image_at) >= c.prompt_ids.size())
    throw Error("{}: {}@image_at = {}: must be in [1, P = {}) (text before and after the image)",
                where, obj, c.image_at, c.prompt_ids.size());
  if (c.image_dim < 1) throw Error("{}: {}@image_dim = {}: must be >= 1", where, obj, c.image_dim);
  validate_frames(where, obj, c, format_version);
  check_size(where, obj + "/image_embeddings", c.image_embeddings.size(),
             mul(uint64_t(c.image_tokens), uint64_t(c.image_dim)),
             fmt::format("image_tokens * image_dim = {} * {}", c.image_tokens, c.image_dim));
  for (const std::string* h : {&c.image_sha256, &c.pixels_sha256, &c.mmproj_sha256})
    if (h->size() != 64) throw Error("{}: {}: an image digest is not 64 hex digits", where, obj);
}

}  // namespace

void validate_golden(const GoldenFile& g, const std::string& where) {
  if (g.format_version < kGoldenOldestFormatVersion || g.format_version > kGoldenFormatVersion)
    throw Error("{}: format_version {} is not supported (expected {}..{})", where, g.format_version,
                kGoldenOldestFormatVersion, kGoldenFormatVersion);
  check_attr_string(where, "model_name", g.model_name);
  check_attr_string(where, "model_sha256", g.model_sha256);
  check_attr_string(where, "reference_version", g.reference_version);
  check_attr_string(where, "reference_revision", g.reference_revision);

  std::set<std::string> seen;
  for (const auto& c : g.cases) {
    check_name(where, "case", c.name);
    const std::string obj = "/cases/" + c.name;
    if (!seen.insert(c.name).second) throw Error("{}: {}: duplicate case name", where, obj);
    check_vocab_k(where, obj, c.n_vocab, c.top_k);
    const uint64_t G = c.greedy_ids.size(), K = static_cast<uint64_t>(c.top_k),
                   V = static_cast<uint64_t>(c.n_vocab);
    if (c.n_full_steps < 0 || static_cast<uint64_t>(c.n_full_steps) > G)
      throw Error(
          "{}: {}: attribute n_full_steps = {} must be in [0, G = {}] (G = size of greedy_ids)",
          where, obj, c.n_full_steps, G);
    const uint64_t F = static_cast<uint64_t>(c.n_full_steps);
    check_size(where, obj + "/full_logits", c.full_logits.size(), mul(F, V),
               fmt::format("n_full_steps * n_vocab = {} * {}", F, V));
    check_size(where, obj + "/topk_ids", c.topk_ids.size(), mul(G, K),
               fmt::format("G * top_k = {} * {}", G, K));
    check_size(where, obj + "/topk_logits", c.topk_logits.size(), mul(G, K),
               fmt::format("G * top_k = {} * {}", G, K));
    check_size(where, obj + "/lse", c.lse.size(), G, "G");
    check_ids(where, obj + "/prompt_ids", c.prompt_ids, c.n_vocab);
    check_ids(where, obj + "/greedy_ids", c.greedy_ids, c.n_vocab);
    check_ids(where, obj + "/topk_ids", c.topk_ids, c.n_vocab);
    validate_grammar(where, obj, c);
    validate_taps(where, obj, c, g.format_version);
    validate_image(where, obj, c, g.format_version);
  }

  seen.clear();
  for (const auto& s : g.scoring) {
    check_name(where, "scoring", s.name);
    const std::string obj = "/scoring/" + s.name;
    if (!seen.insert(s.name).second) throw Error("{}: {}: duplicate scoring name", where, obj);
    check_vocab_k(where, obj, s.n_vocab, s.top_k);
    const uint64_t N = s.token_ids.size(), R = N > 0 ? N - 1 : 0,
                   K = static_cast<uint64_t>(s.top_k);
    check_size(where, obj + "/topk_ids", s.topk_ids.size(), mul(R, K),
               fmt::format("(N - 1) * top_k = {} * {}", R, K));
    check_size(where, obj + "/topk_logits", s.topk_logits.size(), mul(R, K),
               fmt::format("(N - 1) * top_k = {} * {}", R, K));
    check_size(where, obj + "/lse", s.lse.size(), R, "N - 1");
    check_size(where, obj + "/target_logits", s.target_logits.size(), R, "N - 1");
    check_ids(where, obj + "/token_ids", s.token_ids, s.n_vocab);
    check_ids(where, obj + "/topk_ids", s.topk_ids, s.n_vocab);
  }
}

}  // namespace touchstone
