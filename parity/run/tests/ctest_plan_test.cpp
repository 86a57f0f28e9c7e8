// ctest_plan_test.cpp - the CTests generated from backend.json files: every
// in-tree file generates, the fault expectations cover the catalog, each
// expectation kind makes its command, adjustments apply or are refused, and
// the script quotes what it writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <unistd.h>

#include "touchstone/common/error.h"
#include "touchstone/golden/manifest.h"
#include "touchstone/model/faults.h"
#include "touchstone/run/backend_file.h"
#include "touchstone/run/ctest_plan.h"
#include "touchstone/run/fault_expectations.h"

namespace {

namespace fs = std::filesystem;
using touchstone::BackendFile;
using touchstone::CtestTest;

const fs::path kRoot = fs::path(TOUCHSTONE_RUN_MANIFEST).parent_path().parent_path();

touchstone::CtestContext context() {
  return {"/bin/touchstone", "/bin/contract", TOUCHSTONE_RUN_MANIFEST, "",
          "/m.gguf",         "/reports",      {"OMP_NUM_THREADS=1"}};
}

const touchstone::Manifest& manifest() {
  static const touchstone::Manifest m = touchstone::load_manifest(TOUCHSTONE_RUN_MANIFEST);
  return m;
}

BackendFile read_text(const std::string& text) {
  // One file per process and call: CTest runs these tests in parallel processes.
  static int n = 0;
  const fs::path p =
      fs::temp_directory_path() /
      ("ts_ctest_plan_test." + std::to_string(::getpid()) + "." + std::to_string(n++) + ".json");
  std::ofstream(p) << text;
  struct Remove {
    fs::path p;
    ~Remove() { fs::remove(p); }
  } remove{p};
  return touchstone::read_backend_file(p.string());
}

std::vector<CtestTest> plan(const BackendFile& b) {
  return touchstone::ctest_plan({{b, ""}}, manifest(), nullptr, context());
}

const CtestTest& find(const std::vector<CtestTest>& tests, const std::string& name) {
  const auto it = std::ranges::find(tests, name, &CtestTest::name);
  if (it == tests.end()) throw std::runtime_error("no test " + name);
  return *it;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::ranges::count(v, s) > 0;
}

TEST(CtestPlan, EveryInTreeFileGeneratesUniqueTests) {
  const touchstone::Manifest tm =
      touchstone::load_manifest((kRoot / "tests" / "models" / "manifest.json").string());
  std::vector<touchstone::CtestBackend> all;
  for (BackendFile& b : touchstone::find_backend_files(kRoot.string())) all.push_back({b, ""});
  const auto tests = touchstone::ctest_plan(all, manifest(), &tm, context());
  std::set<std::string> names;
  for (const CtestTest& t : tests) EXPECT_TRUE(names.insert(t.name).second) << t.name;
  EXPECT_GT(tests.size(), 800u);  // 873 when this was written: a floor, not a count
  // Every in-tree backend but llama.cpp's runs the fault catalog.
  for (const char* b : {"reference", "cpu_simd", "vulkan", "static_graph", "cuda"})
    EXPECT_TRUE(std::ranges::any_of(tests, [&](const CtestTest& t) {
      return t.name.starts_with(std::string("fault.") + b + ".");
    })) << b;
}

TEST(CtestPlan, FaultExpectationsCoverTheCatalog) {
  std::set<std::string> expected;
  for (const std::string& set : touchstone::fault_expectation_sets())
    for (const auto& f : touchstone::fault_expectations(set)) {
      EXPECT_TRUE(has(touchstone::fault_names(), f.fault)) << set << ": " << f.fault;
      expected.insert(f.fault);
    }
  // Not caught on SmolLM2 (tests/CMakeLists.txt has their tests): softmax_no_max (the
  // stress model), the mixture-of-experts faults and attention_sinks_ignored, no-ops on
  // a dense model without sinks (the MoE and gpt-oss test models), and the image-input
  // faults, no-ops without an image, and the vision-path faults, which no session takes
  // (the vision test models' image cases).
  const std::set<std::string> elsewhere = {"softmax_no_max",
                                           "moe_runner_up",
                                           "moe_renorm_skipped",
                                           "moe_softmax_order",
                                           "moe_shared_expert_dropped",
                                           "attention_sinks_ignored",
                                           "image_attended_causally",
                                           "image_position_offset",
                                           "image_split_position_reset",
                                           "image_resample_filter",
                                           "projector_grid_transposed"};
  for (const std::string& f : touchstone::fault_names())
    if (!elsewhere.contains(f)) {
      EXPECT_TRUE(expected.contains(f)) << f;
    }
  EXPECT_THROW(touchstone::fault_expectations("nonsense"), touchstone::Error);
}

std::string fault_file(const std::string& faults, const std::string& adjust = "[]") {
  return R"({"touchstone_backend": 1, "name": "x",
             "parity": [{"weights": "quantized", "tier": "quantized"}],
             "faults": )" +
         faults + R"(, "adjust": )" + adjust + R"(, "matrix": {"paths": []}})";
}

TEST(CtestPlan, EachExpectationKindMakesItsCommand) {
  const auto tests = plan(read_text(fault_file(
      R"([{"weights": "quantized", "sets": ["catalog", "serving", "structured"],
           "expect": {"causal_mask": "0/0:attn"}, "slow": ["rope_layout"], "max_steps": 1},
          {"weights": "full_precision", "sets": ["full_precision"], "only": ["nibble_order"]}])")));
  const auto& layer = find(tests, "fault.x.quantized.causal_mask").command;
  EXPECT_TRUE(has(layer, "--expect-layer") && has(layer, "0:attn") && has(layer, "--max-steps"));
  EXPECT_EQ(*(std::ranges::find(layer, "--max-steps") + 1), "1");
  EXPECT_TRUE(has(find(tests, "fault.x.quantized.rope_layout").labels, "slow"));
  const auto& cons = find(tests, "fault.x.quantized.rewind_noop");
  EXPECT_TRUE(has(cons.command, "--consistency-only") && cons.processors == 2);
  const auto& serving = find(tests, "fault.x.quantized.batch_all_positions_shift").command;
  EXPECT_TRUE(has(serving, "serving.batch_invariance") && has(serving, "after"));
  const auto& grammar = find(tests, "fault.x.quantized.grammar_early_stop").command;
  EXPECT_TRUE(has(grammar, "structured_answer") && has(grammar, "structured.termination"));
  const auto& pass = find(tests, "fault.x.full_precision.nibble_order").command;
  EXPECT_FALSE(has(pass, "--expect-fail"));
  EXPECT_EQ(
      std::ranges::count_if(tests, [](const CtestTest& t) { return t.name.starts_with("fault."); }),
      18 + 8 + 5 + 1);  // the three sets' faults, and one on full precision
}

TEST(CtestPlan, AdjustmentsApplyOrAreRefused) {
  const std::string one =
      R"([{"weights": "quantized", "sets": ["catalog"], "only": ["gqa_mapping", "rms_eps_10x"]}])";
  const auto tests = plan(read_text(
      fault_file(one, R"([{"tests": ["fault.x.*"], "except": ["*.rms_eps_10x"], "labels": ["gpu"],
               "environment": ["A=1"], "resource_groups": "gpus:1"},
              {"tests": ["fault.x.quantized.gqa_mapping"], "remove_labels": ["fault"]}])")));
  const CtestTest& g = find(tests, "fault.x.quantized.gqa_mapping");
  EXPECT_TRUE(has(g.labels, "gpu") && !has(g.labels, "fault"));
  EXPECT_EQ(g.environment, std::vector<std::string>{"A=1"});
  EXPECT_EQ(g.resource_groups, "gpus:1");
  const CtestTest& r = find(tests, "fault.x.quantized.rms_eps_10x");
  EXPECT_FALSE(has(r.labels, "gpu"));
  EXPECT_EQ(r.environment, std::vector<std::string>{"OMP_NUM_THREADS=1"});
  try {
    plan(read_text(
        fault_file(one, R"([{"tests": ["fault.x.quantized.typo"], "labels": ["slow"]}])")));
    ADD_FAILURE() << "an unmatched pattern was accepted";
  } catch (const touchstone::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/adjust/0/tests: 'fault.x.quantized.typo' matches none"),
              std::string::npos)
        << e.what();
  }
}

TEST(CtestPlan, MalformedFaultEntriesNameTheField) {
  const auto error_of = [](const std::string& faults) {
    try {
      plan(read_text(fault_file(faults)));
    } catch (const touchstone::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of(R"([{"weights": "quantized", "sets": ["catalogue"]}])")
                .find("/faults/0/sets: 'catalogue'"),
            std::string::npos);
  EXPECT_NE(error_of(R"([{"weights": "quantized", "sets": ["catalog"], "only": ["gqa"]}])")
                .find("/faults/0/only: 'gqa' is not a fault of the catalog"),
            std::string::npos);
  EXPECT_NE(error_of(R"([{"weights": "quantized", "sets": ["serving"], "slow": ["gqa_mapping"]}])")
                .find("'gqa_mapping' is not a fault of this entry's sets"),
            std::string::npos);
  EXPECT_NE(error_of(R"([{"weights": "quantized", "sets": ["catalog"]},
                         {"weights": "quantized", "sets": ["catalog"]}])")
                .find("declared twice"),
            std::string::npos);
}

TEST(CtestPlan, ScriptQuotesWhatItWrites) {
  CtestTest t;
  t.name = "a.b";
  t.command = {"/x y/touchstone", "--case", "odd]=]name"};
  t.labels = {"l1", "l2"};
  t.timeout = 5;
  const std::string s = touchstone::ctest_script({t});
  EXPECT_NE(s.find("add_test([=[a.b]=] [=[/x y/touchstone]=] [=[--case]=] [==[odd]=]name]==])"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("LABELS [=[l1;l2]=] TIMEOUT 5)"), std::string::npos) << s;
}

}  // namespace
