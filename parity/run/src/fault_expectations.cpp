// fault_expectations.cpp - the expectation sets of touchstone/run/fault_expectations.h.
#include "touchstone/run/fault_expectations.h"

#include <fmt/ranges.h>

#include <map>

#include "touchstone/common/error.h"

namespace touchstone {
namespace {

// causal_mask: layer 1, whose attention reads K/V that layer 0 computed from
// future tokens; last_layer_skipped: layer 29 of SmolLM2's 30.
const std::vector<FaultExpectation> kCatalog = {
    {"rope_base_off_1pct", "0/0:attn"},
    {"rope_layout", "0/0:attn"},
    {"kv_position_off_by_one", "0/0:attn"},
    {"kv_write_next", "0/0:attn"},
    {"gqa_mapping", "0/0:attn"},
    {"attention_scale", "0/0:attn"},
    {"rms_eps_10x", "0/0:attn"},
    {"quant_scale_min_swap", "0/0:attn"},
    {"nibble_order", "0/0:attn"},
    {"fp16_accumulation", "0/0:attn"},
    {"causal_mask", "0/1:attn"},
    {"last_layer_skipped", "0/29:attn"},
    {"logits_perturb_1e-3", "0/after"},
    {"rewind_noop", "consistency.rewind_replay@0"},
    {"thread_order_reduction", "consistency.threads@0"},
    {"logits_row_shift", "consistency.prefill_vs_decode@1"},
    {"prefill_position_reset", "consistency.chunked_prefill@5"},
    {"session_order_reduction", "consistency.run_to_run@0+"},
};

const std::vector<FaultExpectation> kFullPrecision = {
    {"quant_scale_min_swap", "pass"},
    {"nibble_order", "pass"},
    {"fp16_accumulation", "0/0:attn"},
};

// The layer tap where a backend has taps (batch entry or fork against the
// sequence alone); speculative_verify's all-position rows are not located.
// The last three escaped every serving plan before the plans gained forks
// that share KV rows, all-position rows shifted inside a batch and a KV row
// read from the previous entry at a 32-token page boundary.
const std::vector<FaultExpectation> kServing = {
    {"batch_token_count_split", "serving.batch_invariance/0:attn"},
    {"batch_kv_leak", "serving.content_isolation/0:attn"},
    {"fork_short_copy", "serving.prefix_fork/0:attn"},
    {"batch_position_offset", "serving.batch_invariance/0:attn"},
    {"verify_row_shift", "serving.speculative_verify"},
    {"fork_shared_kv", "serving.prefix_fork/0:attn"},
    {"batch_all_positions_shift", "serving.batch_invariance/after"},
    {"batch_page_boundary_leak", "serving.batch_invariance/0:attn"},
};

// On structured_answer. A mask one step late also breaks constrained_greedy and
// non_interference; a grammar left where rejected drafts took it also breaks
// rollback (tests/CMakeLists.txt has those tests).
const std::vector<FaultExpectation> kStructured = {
    {"grammar_mask_one_step_late", "structured.mask_parity@1"},
    {"grammar_straddling_token", "structured.mask_parity@0"},
    {"grammar_early_stop", "structured.termination@0"},
    {"grammar_advanced_on_rejected_draft", "structured.speculative@1"},
    {"grammar_mask_shared_in_batch", "structured.batch_isolation@1"},
};

const std::map<std::string, const std::vector<FaultExpectation>*>& sets() {
  static const std::map<std::string, const std::vector<FaultExpectation>*> s = {
      {"catalog", &kCatalog},
      {"full_precision", &kFullPrecision},
      {"serving", &kServing},
      {"structured", &kStructured}};
  return s;
}

}  // namespace

const std::vector<std::string>& fault_expectation_sets() {
  static const std::vector<std::string> names = {"catalog", "full_precision", "serving",
                                                 "structured"};
  return names;
}

const std::vector<FaultExpectation>& fault_expectations(const std::string& set) {
  const auto it = sets().find(set);
  if (it == sets().end())
    throw Error("unknown fault expectation set '{}' (known: {})", set,
                fmt::join(fault_expectation_sets(), ", "));
  return *it->second;
}

}  // namespace touchstone
