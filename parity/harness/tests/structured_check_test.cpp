// Structured output (docs/structured-output.md): check_case against SmolLM2's
// committed golden of a grammar case passes, and fails, naming the step, when
// the golden's allowed set or its constrained token is changed: the mask parity
// and constrained greedy checks can fail. Both ways a grammar is applied: the
// reference enforces it itself (ABI v7), cpu_simd's logits get the harness's mask.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <ostream>
#include <string>

#include "touchstone/golden/manifest.h"
#include "touchstone/grammar/oracle.h"
#include "touchstone/harness/parity.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/tokenizer.h"

namespace touchstone {
namespace {

constexpr const char* kCase = "structured_answer";

struct Way {
  const char* backend;
  const char* enforcement;
};
// Printed by name: gtest's default prints the struct's bytes (two pointers), which made
// the CTest names that gtest_discover_tests lists differ from build to build.
void PrintTo(const Way& w, std::ostream* os) { *os << w.backend << " (" << w.enforcement << ")"; }

class StructuredCheck : public ::testing::TestWithParam<Way> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(TOUCHSTONE_STRUCTURED_MODEL)) {
      GTEST_SKIP() << "model not found: " << TOUCHSTONE_STRUCTURED_MODEL
                   << " (ci/bootstrap fetches it)";
    }
    tok_ = std::make_unique<Tokenizer>(
        tokenizer_data_from_gguf(gguf::File::open(TOUCHSTONE_STRUCTURED_MODEL)));
    const GoldenFile file = read_golden_file(TOUCHSTONE_STRUCTURED_GOLDEN);
    const GoldenCase* c = file.find_case(kCase);
    ASSERT_NE(c, nullptr) << kCase << " not in " << TOUCHSTONE_STRUCTURED_GOLDEN;
    ASSERT_TRUE(c->has_grammar());
    ASSERT_GE(c->greedy_ids.size(), 2u);
    golden_ = *c;
    try {
      lib_ = BackendLibrary::load(GetParam().backend);
    } catch (const Error& e) {
      GTEST_SKIP() << GetParam().backend << " is not built here: " << e.what();
    }
    model_ = std::make_unique<BackendModel>(lib_, TOUCHSTONE_STRUCTURED_MODEL);
  }

  CaseResult check(const GoldenCase& g) {
    BackendSession s(*model_, BackendSessionOptions{});
    static const Manifest m = load_manifest(TOUCHSTONE_STRUCTURED_MANIFEST);
    return check_case(s, *tok_, g, m.find_profile("exact"), 0, {});
  }

  static std::string joined(const CaseResult& r) {
    std::string all;
    for (const std::string& f : r.failures) all += f + "\n";
    return all;
  }

  std::unique_ptr<Tokenizer> tok_;
  GoldenCase golden_;
  std::shared_ptr<BackendLibrary> lib_;
  std::unique_ptr<BackendModel> model_;
};

TEST_P(StructuredCheck, PassesTheReferencesGolden) {
  const CaseResult r = check(golden_);
  EXPECT_TRUE(r.passed) << joined(r);
  EXPECT_EQ(r.grammar_enforcement, GetParam().enforcement);
  EXPECT_EQ(r.n_matched, int(golden_.greedy_ids.size()));
}

// One token's bit flipped in step 1's recorded allowed set.
TEST_P(StructuredCheck, AChangedAllowedSetFailsMaskParityAtItsStep) {
  GoldenCase g = golden_;
  const int32_t token = 100;
  g.allowed_masks[g.mask_words() + size_t(token) / 32] ^= 1u << (token % 32);
  const CaseResult r = check(g);
  EXPECT_FALSE(r.passed);
  EXPECT_NE(joined(r).find("structured.mask_parity: step 1:"), std::string::npos) << joined(r);
  EXPECT_NE(joined(r).find("token 100 "), std::string::npos) << joined(r);
}

// The golden's constrained token at step 0 replaced by the allowed token the
// backend's masked logits rank lowest: the constrained greedy check fails there.
TEST_P(StructuredCheck, AnotherConstrainedTokenFailsGreedyAtItsStep) {
  GoldenCase g = golden_;
  const std::span<const uint32_t> mask(g.allowed_masks.data(), g.mask_words());
  int32_t other = -1;
  for (int32_t t = 0; t < g.n_vocab; ++t) {
    if (grammar::mask_allows(mask, t) && t != g.greedy_ids[0]) other = t;
  }
  ASSERT_GE(other, 0) << "step 0 allows a single token";
  g.greedy_ids[0] = other;
  const CaseResult r = check(g);
  EXPECT_FALSE(r.passed);
  EXPECT_NE(joined(r).find("greedy diverges at step 0"), std::string::npos) << joined(r);
}

INSTANTIATE_TEST_SUITE_P(Ways, StructuredCheck,
                         ::testing::Values(Way{"reference", "enforced by the backend"},
                                           Way{"cpu_simd", "applied by the harness"}),
                         [](const ::testing::TestParamInfo<Way>& way) {
                           return std::string(way.param.backend);
                         });

}  // namespace
}  // namespace touchstone
