// fault_expectations.h - where each fault of the catalog (touchstone/model/faults.h)
// is caught on SmolLM2 by a backend that computes the reference's arithmetic
// closely enough to fail at the same place (the reference, cpu_simd, vulkan,
// cuda; docs/metrics.md#fault-catalog-and-margins). The one list the fault
// CTests of every backend.json are generated from (touchstone/run/ctest_plan.h).
//
// EXPECT (the --expect-step value, with the layer tap after a slash):
//   STEP/LAYER:POINT  the goldens catch it at greedy step STEP, and the first
//                     divergent layer tap is LAYER's POINT (attn | ffn | resid)
//   STEP/after        every layer tap matches: the fault is past the last layer
//   CHECK@POS[+]      the golden-free consistency check CHECK catches it at POS
//                     ("+": other bitwise checks fail too)
//   serving.CHECK[/LAYER:POINT | /after]  its serving check (quick plan) fails
//   structured.CHECK@STEP  its structured-output check fails at STEP
//   pass              the run must PASS with the fault set
#pragma once

#include <string>
#include <vector>

namespace touchstone {

struct FaultExpectation {
  std::string fault, expect;
};

// The sets, in order:
//   catalog         every fault but the serving and structured ones, on the quantized path
//   full_precision  on full precision: the quantized-only faults pass, fp16_accumulation fails
//   serving         the serving faults, each failing its serving check
//   structured      the structured-output faults (a backend that enforces grammars itself)
const std::vector<std::string>& fault_expectation_sets();
// One set's expectations in order; throws Error naming the known sets for another name.
const std::vector<FaultExpectation>& fault_expectations(const std::string& set);

}  // namespace touchstone
