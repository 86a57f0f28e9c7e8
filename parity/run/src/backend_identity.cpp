#include "touchstone/run/backend_identity.h"

#include <algorithm>
#include <utility>

#include "touchstone/model/gguf.h"
#include "touchstone/model/quant.h"

namespace touchstone {

std::vector<std::string> capability_flag_names(uint32_t flags) {
  const std::pair<uint32_t, const char*> names[] = {
      {TS_CAP_ALL_POSITION_LOGITS, "all_position_logits"},
      {TS_CAP_DEVICE_GREEDY, "device_greedy"},
      {TS_CAP_BATCHED_SESSIONS, "batched_sessions"},
      {TS_CAP_KV_PREFIX_COPY, "kv_prefix_copy"},
      {TS_CAP_BITWISE_DETERMINISM, "bitwise_determinism"},
      {TS_CAP_STATIC_SHAPES, "static_shapes"},
      {TS_CAP_TOP_N_LOGPROBS, "top_n_logprobs"},
      {TS_CAP_BATCH_INVARIANT, "batch_invariant"},
      {TS_CAP_BITWISE_NOT_ACROSS_FORKS, "bitwise_not_across_forks"}};
  std::vector<std::string> out;
  for (const auto& [bit, name] : names)
    if (flags & bit) out.emplace_back(name);
  return out;
}

std::vector<std::string> weight_type_names(uint64_t bits) {
  std::vector<std::string> out;
  for (uint32_t t = 0; t < 64; ++t)
    if (bits & (1ull << t)) out.emplace_back(gguf::type_name(gguf::TensorType(t)));
  return out;
}

std::string joined_or_none(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
  return s.empty() ? "none" : s;
}

BackendCapabilities describe_capabilities(const ts_capabilities& c) {
  BackendCapabilities out;
  out.flags = capability_flag_names(c.flags);
  out.weight_types = weight_type_names(c.weight_types);
  out.max_context = c.max_context;
  for (int32_t i = 0; i < std::clamp(c.n_shape_buckets, 0, 16); ++i)
    out.shape_buckets.push_back(c.shape_buckets[i]);
  if (c.determinism_note) out.determinism_note = c.determinism_note;
  if (c.flags & TS_CAP_TOP_N_LOGPROBS) out.top_n = c.top_n;
  if (c.flags & TS_CAP_BATCH_INVARIANT) {
    if (c.batch_invariant_paths == 0 ||
        (c.batch_invariant_paths & (1u << TS_WEIGHTS_FULL_PRECISION)))
      out.batch_invariant_paths.emplace_back("full_precision");
    if (c.batch_invariant_paths == 0 || (c.batch_invariant_paths & (1u << TS_WEIGHTS_QUANTIZED)))
      out.batch_invariant_paths.emplace_back("quantized");
  }
  out.max_batch = c.max_batch;
  return out;
}

}  // namespace touchstone
