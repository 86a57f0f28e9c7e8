// oracle.cpp - GrammarOracle over xgrammar::GrammarMatcher, grammar kinds, errors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <regex>
#include <stdexcept>

#include "internal.h"

namespace touchstone::grammar {

std::string_view grammar_kind_name(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::json_schema:
      return "json_schema";
    case GrammarKind::gbnf:
      return "gbnf";
    case GrammarKind::regex:
      return "regex";
  }
  return "?";
}

GrammarKind parse_grammar_kind(std::string_view name) {
  for (GrammarKind k : {GrammarKind::json_schema, GrammarKind::gbnf, GrammarKind::regex}) {
    if (grammar_kind_name(k) == name) return k;
  }
  throw GrammarError("unknown grammar kind \"{}\" (expected json_schema, gbnf or regex)", name);
}

std::string xgrammar_message(const std::exception& e) {
  // XGrammar's LogFatalError::what() is "[12:34:56] /path/file.cc:123: message\n".
  static const std::regex prefix(R"(^\[\d\d:\d\d:\d\d\] [^\s]+:\d+: )");
  std::string m = std::regex_replace(e.what(), prefix, "", std::regex_constants::format_first_only);
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

namespace {

std::string case_prefix(const GrammarSpec& spec) {
  return fmt::format("grammar \"{}\" ({}): ", spec.name, grammar_kind_name(spec.kind));
}

}  // namespace

xgrammar::CompiledGrammar GrammarVocab::Impl::compile(const GrammarSpec& spec) {
  std::lock_guard lock(compile_mutex);
  try {
    switch (spec.kind) {
      case GrammarKind::json_schema:
        return compiler->CompileJSONSchema(spec.text, /*any_whitespace=*/true);
      case GrammarKind::gbnf:
        return compiler->CompileGrammar(gbnf_to_xgrammar(spec.text), "root");
      case GrammarKind::regex:
        return compiler->CompileRegex(spec.text);
    }
  } catch (const std::exception& e) {
    throw GrammarError(case_prefix(spec) + xgrammar_message(e));
  }
  throw GrammarError(case_prefix(spec) + "unknown grammar kind");
}

struct GrammarOracle::Impl {
  Impl(GrammarVocab v, GrammarSpec s, xgrammar::GrammarMatcher m)
      : vocab(std::move(v)), spec(std::move(s)), matcher(std::move(m)) {}

  GrammarVocab vocab;
  GrammarSpec spec;
  mutable xgrammar::GrammarMatcher matcher;  // FillNextTokenBitmask is not const
  int accepted = 0;
  bool terminated = false;
};

GrammarOracle::GrammarOracle(const GrammarVocab& vocab, const GrammarSpec& spec)
    : impl_(std::make_unique<Impl>(vocab, spec,
                                   xgrammar::GrammarMatcher(vocab.impl_->compile(spec)))) {
  if (!can_terminate() && mask_count(allowed_mask()) == 0) {
    throw GrammarError(case_prefix(spec) +
                       "the language is empty: no token is allowed at the start and the empty "
                       "string is not a sentence of the grammar");
  }
}

GrammarOracle::GrammarOracle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrammarOracle::~GrammarOracle() = default;
GrammarOracle::GrammarOracle(GrammarOracle&&) noexcept = default;
GrammarOracle& GrammarOracle::operator=(GrammarOracle&&) noexcept = default;

GrammarOracle GrammarOracle::fork() const {
  auto copy = std::make_unique<Impl>(impl_->vocab, impl_->spec, impl_->matcher.Fork());
  copy->accepted = impl_->accepted;
  copy->terminated = impl_->terminated;
  return GrammarOracle(std::move(copy));
}

const GrammarSpec& GrammarOracle::spec() const { return impl_->spec; }
const GrammarVocab& GrammarOracle::vocab() const { return impl_->vocab; }

void GrammarOracle::fill_mask(std::span<uint32_t> words) const {
  const GrammarVocab::Impl& v = *impl_->vocab.impl_;
  if (words.size() != v.allowed_ever.size()) {
    throw std::invalid_argument(fmt::format("grammar mask: {} words given, {} needed for {} tokens",
                                            words.size(), v.allowed_ever.size(), v.n_vocab));
  }
  std::fill(words.begin(), words.end(), 0u);
  if (impl_->terminated) return;
  int64_t shape = static_cast<int64_t>(words.size());
  DLTensor t{};
  t.data = words.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = &shape;
  impl_->matcher.FillNextTokenBitmask(&t);
  // Only text and stop tokens, never the bits past n_vocab (XGrammar may set them).
  for (size_t w = 0; w < words.size(); ++w) words[w] &= v.allowed_ever[w];
}

std::vector<uint32_t> GrammarOracle::allowed_mask() const {
  std::vector<uint32_t> words(impl_->vocab.mask_words());
  fill_mask(words);
  return words;
}

uint64_t GrammarOracle::mask_digest() const { return grammar::mask_digest(allowed_mask()); }

size_t GrammarOracle::apply_mask(std::span<float> logits) const {
  const int32_t n = impl_->vocab.n_vocab();
  if (logits.size() != size_t(n)) {
    throw std::invalid_argument(
        fmt::format("grammar apply_mask: {} logits given, n_vocab is {}", logits.size(), n));
  }
  return grammar::apply_mask(allowed_mask(), logits);
}

bool GrammarOracle::accept(int32_t token) {
  const GrammarVocab& v = impl_->vocab;
  // Checked here so that XGrammar does not log a warning for these.
  if (impl_->terminated || !(v.is_text(token) || v.is_stop(token))) return false;
  if (!impl_->matcher.AcceptToken(token)) return false;
  ++impl_->accepted;
  impl_->terminated = v.is_stop(token);
  return true;
}

void GrammarOracle::rollback(int n_tokens) {
  if (n_tokens < 0 || n_tokens > impl_->accepted) {
    throw std::out_of_range(
        fmt::format("grammar rollback of {} tokens: {} accepted", n_tokens, impl_->accepted));
  }
  if (n_tokens == 0) return;
  impl_->matcher.Rollback(n_tokens);
  impl_->accepted -= n_tokens;
  impl_->terminated = impl_->matcher.IsTerminated();
}

int GrammarOracle::n_accepted() const { return impl_->accepted; }

bool GrammarOracle::can_terminate() const {
  return !impl_->terminated && impl_->matcher.IsCompleted();
}

bool GrammarOracle::is_completed() const {
  if (!can_terminate()) return false;
  const std::vector<uint32_t> mask = allowed_mask();
  const std::vector<uint32_t>& text = impl_->vocab.impl_->text_words;
  for (size_t w = 0; w < mask.size(); ++w) {
    if (mask[w] & text[w]) return false;
  }
  return true;
}

bool GrammarOracle::is_terminated() const { return impl_->terminated; }

}  // namespace touchstone::grammar
