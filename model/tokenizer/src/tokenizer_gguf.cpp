// tokenizer_gguf.cpp - TokenizerData from the tokenizer.ggml.* keys of a GGUF
// file (key names and defaults as llama.cpp's llama_vocab::impl::load).
#include <limits>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/tokenizer.h"

namespace touchstone {

namespace {

int32_t find_id(const gguf::File& f, std::string_view key, int32_t dflt, size_t n_tokens) {
  const auto v = f.find_uint(key);
  if (!v) return dflt;
  if (*v >= n_tokens)
    throw Error("{}: key {}: token id {} out of range (vocabulary has {} tokens)", f.path(), key,
                *v, n_tokens);
  return static_cast<int32_t>(*v);
}

}  // namespace

TokenizerData tokenizer_data_from_gguf(const gguf::File& f) {
  TokenizerData d;
  d.model = f.get_string("tokenizer.ggml.model");
  d.pre = f.find_string("tokenizer.ggml.pre").value_or("default");
  d.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (d.tokens.empty()) throw Error("{}: key tokenizer.ggml.tokens: empty vocabulary", f.path());
  if (d.tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw Error("{}: key tokenizer.ggml.tokens: {} tokens is too many", f.path(), d.tokens.size());

  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != d.tokens.size())
      throw Error("{}: key tokenizer.ggml.token_type: {} entries for {} tokens", f.path(),
                  types.size(), d.tokens.size());
    d.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < 0 || types[i] > 6)
        throw Error("{}: key tokenizer.ggml.token_type: entry {} has unknown type {}", f.path(), i,
                    types[i]);
      d.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  }
  if (f.has("tokenizer.ggml.scores")) {
    const auto scores = f.get_float_array("tokenizer.ggml.scores");
    if (scores.size() != d.tokens.size())
      throw Error("{}: key tokenizer.ggml.scores: {} entries for {} tokens", f.path(),
                  scores.size(), d.tokens.size());
    d.scores.reserve(scores.size());
    for (double s : scores) d.scores.push_back(static_cast<float>(s));
  }
  if (f.has("tokenizer.ggml.merges")) d.merges = f.get_string_array("tokenizer.ggml.merges");

  const bool spm = d.model == "llama";
  const size_t n = d.tokens.size();
  d.bos = find_id(f, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n);
  d.eos = find_id(f, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n);
  d.unk = find_id(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
  d.pad = find_id(f, "tokenizer.ggml.padding_token_id", -1, n);
  if (spm) {  // llama.cpp's SPM defaults can point past a tiny vocabulary
    if (d.bos >= static_cast<int32_t>(n)) d.bos = -1;
    if (d.eos >= static_cast<int32_t>(n)) d.eos = -1;
    if (d.unk >= static_cast<int32_t>(n)) d.unk = -1;
  }
  d.add_bos = f.find_bool("tokenizer.ggml.add_bos_token").value_or(spm);
  d.add_eos = f.find_bool("tokenizer.ggml.add_eos_token").value_or(false);
  d.add_space_prefix = f.find_bool("tokenizer.ggml.add_space_prefix").value_or(spm);
  if (d.add_bos && d.bos < 0) d.add_bos = false;
  if (d.add_eos && d.eos < 0) d.add_eos = false;
  return d;
}

}  // namespace touchstone
