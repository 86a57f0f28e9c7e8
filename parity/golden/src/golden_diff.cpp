// diff_golden: bit-for-bit comparison of two golden files.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "touchstone/golden/golden.h"

namespace touchstone {

namespace {

template <typename T>
auto bits(T v) {
  if constexpr (std::is_same_v<T, float>) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
  } else if constexpr (std::is_same_v<T, double>) {
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
  } else {
    return v;
  }
}

template <typename T>
std::string show(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return fmt::format("{} (0x{:0{}x})", v, bits(v), sizeof(T) * 2);
  else
    return fmt::format("{}", v);
}

std::string index_str(size_t i, size_t cols) {
  if (cols == 0) return fmt::format("[{}]", i);
  return fmt::format("[{}, {}]", i / cols, i % cols);
}

// cols > 0: a row-major 2-D field with that many columns (index shown as [row, col]).
template <typename T>
void diff_vec(std::vector<std::string>& out, const std::string& who, const char* field,
              const std::vector<T>& a, const std::vector<T>& b, size_t cols = 0) {
  if (a.size() != b.size()) {
    out.push_back(fmt::format("{}: {}: size differs: committed {}, fresh {}", who, field, a.size(),
                              b.size()));
    return;
  }
  size_t first = a.size(), count = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (bits(a[i]) != bits(b[i])) {
      if (count++ == 0) first = i;
    }
  }
  if (count == 0) return;
  out.push_back(fmt::format("{}: {}{}: committed {} != fresh {} ({} of {} elements differ)", who,
                            field, index_str(first, cols), show(a[first]), show(b[first]), count,
                            a.size()));
}

void diff_bytes(std::vector<std::string>& out, const std::string& who, const char* field,
                const std::string& a, const std::string& b) {
  if (a == b) return;
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  auto byte = [](const std::string& s, size_t k) {
    return k < s.size() ? fmt::format("0x{:02x}", static_cast<unsigned char>(s[k]))
                        : std::string("<end>");
  };
  out.push_back(fmt::format("{}: {}: byte {} differs: committed {} != fresh {} (sizes {} / {})",
                            who, field, i, byte(a, i), byte(b, i), a.size(), b.size()));
}

template <typename T>
void diff_scalar(std::vector<std::string>& out, const std::string& who, const char* field,
                 const T& a, const T& b) {
  if (a != b) out.push_back(fmt::format("{}: {}: committed {} != fresh {}", who, field, a, b));
}

void diff_case(std::vector<std::string>& out, const GoldenCase& a, const GoldenCase& b) {
  const std::string who = fmt::format("case '{}'", a.name);
  diff_bytes(out, who, "prompt_text", a.prompt_text, b.prompt_text);
  diff_scalar(out, who, "chat", a.chat, b.chat);
  diff_scalar(out, who, "n_vocab", a.n_vocab, b.n_vocab);
  diff_scalar(out, who, "top_k", a.top_k, b.top_k);
  diff_scalar(out, who, "n_full_steps", a.n_full_steps, b.n_full_steps);
  diff_vec(out, who, "prompt_ids", a.prompt_ids, b.prompt_ids);
  diff_vec(out, who, "greedy_ids", a.greedy_ids, b.greedy_ids);
  diff_bytes(out, who, "greedy_text", a.greedy_text, b.greedy_text);
  diff_vec(out, who, "full_logits", a.full_logits, b.full_logits,
           a.n_vocab == b.n_vocab ? static_cast<size_t>(a.n_vocab) : 0);
  const size_t k = a.top_k == b.top_k ? static_cast<size_t>(a.top_k) : 0;
  diff_vec(out, who, "topk_ids", a.topk_ids, b.topk_ids, k);
  diff_vec(out, who, "topk_logits", a.topk_logits, b.topk_logits, k);
  diff_vec(out, who, "lse", a.lse, b.lse);
  diff_vec(out, who, "tap_steps", a.tap_steps, b.tap_steps);
  diff_scalar(out, who, "tap_layers", a.tap_layers, b.tap_layers);
  diff_scalar(out, who, "tap_dim", a.tap_dim, b.tap_dim);
  diff_vec(out, who, "taps", a.taps, b.taps, a.tap_dim == b.tap_dim ? size_t(a.tap_dim) : 0);
  diff_bytes(out, who, "grammar_kind", a.grammar_kind, b.grammar_kind);
  diff_bytes(out, who, "grammar_text", a.grammar_text, b.grammar_text);
  diff_vec(out, who, "allowed_masks", a.allowed_masks, b.allowed_masks, a.mask_words());
  diff_scalar(out, who, "image_at", a.image_at, b.image_at);
  diff_vec(out, who, "image_frames", a.image_frames, b.image_frames);
  diff_scalar(out, who, "image_bidirectional", a.image_bidirectional, b.image_bidirectional);
  diff_bytes(out, who, "image_sha256", a.image_sha256, b.image_sha256);
  diff_bytes(out, who, "pixels_sha256", a.pixels_sha256, b.pixels_sha256);
  diff_bytes(out, who, "mmproj_sha256", a.mmproj_sha256, b.mmproj_sha256);
  diff_vec(out, who, "image_embeddings", a.image_embeddings, b.image_embeddings,
           a.image_dim == b.image_dim ? size_t(a.image_dim) : 0);
}

void diff_scoring(std::vector<std::string>& out, const GoldenScoring& a, const GoldenScoring& b) {
  const std::string who = fmt::format("scoring '{}'", a.name);
  diff_bytes(out, who, "text", a.text, b.text);
  diff_scalar(out, who, "n_vocab", a.n_vocab, b.n_vocab);
  diff_scalar(out, who, "top_k", a.top_k, b.top_k);
  diff_vec(out, who, "token_ids", a.token_ids, b.token_ids);
  const size_t k = a.top_k == b.top_k ? static_cast<size_t>(a.top_k) : 0;
  diff_vec(out, who, "topk_ids", a.topk_ids, b.topk_ids, k);
  diff_vec(out, who, "topk_logits", a.topk_logits, b.topk_logits, k);
  diff_vec(out, who, "lse", a.lse, b.lse);
  diff_vec(out, who, "target_logits", a.target_logits, b.target_logits);
}

template <typename Item, typename Find, typename Diff>
void diff_list(std::vector<std::string>& out, const char* kind, const std::vector<Item>& a,
               const std::vector<Item>& b, Find find_b, Find find_a, Diff diff) {
  std::vector<std::string> na, nb;
  for (const auto& x : a) na.push_back(x.name);
  for (const auto& x : b) nb.push_back(x.name);
  for (const auto& x : a) {
    if (const Item* y = find_b(x.name))
      diff(out, x, *y);
    else
      out.push_back(fmt::format("{} '{}': missing in fresh", kind, x.name));
  }
  for (const auto& y : b)
    if (find_a(y.name) == nullptr)
      out.push_back(fmt::format("{} '{}': not in committed", kind, y.name));
  if (na != nb && std::multiset<std::string>(na.begin(), na.end()) ==
                      std::multiset<std::string>(nb.begin(), nb.end()))
    out.push_back(fmt::format("{} order differs: committed [{}], fresh [{}]", kind,
                              fmt::join(na, ", "), fmt::join(nb, ", ")));
}

}  // namespace

std::vector<std::string> diff_golden(const GoldenFile& committed, const GoldenFile& fresh) {
  std::vector<std::string> out;
  const std::string who = "file";
  diff_scalar(out, who, "format_version", committed.format_version, fresh.format_version);
  diff_scalar(out, who, "model_name", committed.model_name, fresh.model_name);
  diff_scalar(out, who, "model_sha256", committed.model_sha256, fresh.model_sha256);
  diff_scalar(out, who, "reference_version", committed.reference_version, fresh.reference_version);
  diff_scalar(out, who, "reference_revision", committed.reference_revision,
              fresh.reference_revision);
  using FindCase = std::function<const GoldenCase*(const std::string&)>;
  using FindScoring = std::function<const GoldenScoring*(const std::string&)>;
  diff_list(out, "case", committed.cases, fresh.cases,
            FindCase([&](const std::string& n) { return fresh.find_case(n); }),
            FindCase([&](const std::string& n) { return committed.find_case(n); }), diff_case);
  diff_list(out, "scoring", committed.scoring, fresh.scoring,
            FindScoring([&](const std::string& n) { return fresh.find_scoring(n); }),
            FindScoring([&](const std::string& n) { return committed.find_scoring(n); }),
            diff_scoring);
  return out;
}

}  // namespace touchstone
