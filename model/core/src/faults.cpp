// faults.cpp - the fault catalog (touchstone/model/faults.h).
#include "touchstone/model/faults.h"

#include "touchstone/common/error.h"

namespace touchstone {

double fault_noise_sign(uint64_t i) {
  uint64_t z = i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return ((z ^ (z >> 31)) & 1u) ? 1.0 : -1.0;
}

namespace {

// The catalog, in order: each name with what it sets (docs/metrics.md#fault-catalog-and-margins).
struct FaultEntry {
  const char* name;
  void (*apply)(Faults&);
};
constexpr FaultEntry kFaults[] = {
    {"rope_base_off_1pct", [](Faults& f) { f.rope_base_scale = 1.01; }},
    {"rope_layout", [](Faults& f) { f.rope_layout = true; }},
    {"kv_position_off_by_one", [](Faults& f) { f.kv_off_by_one = true; }},
    {"kv_write_next", [](Faults& f) { f.kv_write_next = true; }},
    {"gqa_mapping", [](Faults& f) { f.gqa_mapping = true; }},
    {"attention_scale", [](Faults& f) { f.attention_scale = true; }},
    {"softmax_no_max", [](Faults& f) { f.softmax_no_max = true; }},
    {"rms_eps_10x", [](Faults& f) { f.rms_eps_scale = 10.0; }},
    {"quant_scale_min_swap", [](Faults& f) { f.quant_scale_min_swap = true; }},
    {"nibble_order", [](Faults& f) { f.nibble_order = true; }},
    {"fp16_accumulation", [](Faults& f) { f.fp16_accumulation = true; }},
    {"rewind_noop", [](Faults& f) { f.rewind_noop = true; }},
    {"causal_mask", [](Faults& f) { f.causal_mask = true; }},
    {"thread_order_reduction", [](Faults& f) { f.thread_order_reduction = true; }},
    {"last_layer_skipped", [](Faults& f) { f.last_layer_skipped = true; }},
    {"logits_perturb_1e-3", [](Faults& f) { f.logit_noise = 1e-3; }},
    {"logits_row_shift", [](Faults& f) { f.logits_row_shift = true; }},
    {"prefill_position_reset", [](Faults& f) { f.prefill_position_reset = true; }},
    {"session_order_reduction", [](Faults& f) { f.session_order_reduction = true; }},
    {"batch_token_count_split", [](Faults& f) { f.batch_token_count_split = true; }},
    {"batch_kv_leak", [](Faults& f) { f.batch_kv_leak = true; }},
    {"fork_short_copy", [](Faults& f) { f.fork_short_copy = true; }},
    {"batch_position_offset", [](Faults& f) { f.batch_position_offset = true; }},
    {"verify_row_shift", [](Faults& f) { f.verify_row_shift = true; }},
    {"fork_shared_kv", [](Faults& f) { f.fork_shared_kv = true; }},
    {"batch_all_positions_shift", [](Faults& f) { f.batch_all_positions_shift = true; }},
    {"batch_page_boundary_leak", [](Faults& f) { f.batch_page_boundary_leak = true; }},
    {"grammar_mask_one_step_late", [](Faults& f) { f.grammar_mask_late = true; }},
    {"grammar_straddling_token", [](Faults& f) { f.grammar_straddle = true; }},
    {"grammar_early_stop", [](Faults& f) { f.grammar_early_stop = true; }},
    {"grammar_advanced_on_rejected_draft", [](Faults& f) { f.grammar_draft_advance = true; }},
    {"grammar_mask_shared_in_batch", [](Faults& f) { f.grammar_batch_mask = true; }},
    {"moe_runner_up", [](Faults& f) { f.moe_runner_up = true; }},
    {"moe_renorm_skipped", [](Faults& f) { f.moe_renorm_skipped = true; }},
    {"moe_softmax_order", [](Faults& f) { f.moe_softmax_order = true; }},
    {"moe_shared_expert_dropped", [](Faults& f) { f.moe_shared_expert_dropped = true; }},
    {"attention_sinks_ignored", [](Faults& f) { f.attention_sinks_ignored = true; }},
    {"image_attended_causally", [](Faults& f) { f.image_attended_causally = true; }},
    {"image_position_offset", [](Faults& f) { f.image_position_offset = true; }},
    {"image_split_position_reset", [](Faults& f) { f.image_split_position_reset = true; }},
    {"image_resample_filter", [](Faults& f) { f.image_resample_filter = true; }},
    {"projector_grid_transposed", [](Faults& f) { f.projector_grid_transposed = true; }},
};

}  // namespace

const std::vector<std::string>& fault_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const FaultEntry& e : kFaults) n.emplace_back(e.name);
    return n;
  }();
  return names;
}

Faults parse_fault(const std::string& name) {
  Faults f;
  f.name = name;
  if (name.empty()) return f;
  for (const FaultEntry& e : kFaults) {
    if (name == e.name) {
      e.apply(f);
      return f;
    }
  }
  std::string known;
  for (const auto& k : fault_names()) known += (known.empty() ? "" : ", ") + k;
  throw Error("unknown fault '{}' (known: {})", name, known);
}

}  // namespace touchstone
