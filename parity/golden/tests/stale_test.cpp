// Tests for the stale-golden check (parity/harness stale.h): the manifest
// against what the golden recorded.
#include <gtest/gtest.h>

#include <string>

#include "touchstone/common/error.h"
#include "touchstone/harness/chat.h"
#include "touchstone/harness/recorder.h"
#include "touchstone/harness/stale.h"

using touchstone::GoldenCase;
using touchstone::GoldenFile;
using touchstone::Manifest;
using touchstone::ManifestCase;

namespace {

const std::string kSha(64, 'a');

// SmolLM2's template: chat prompts are rendered by the C++ ChatML fast path.
const touchstone::ChatTemplate kChat{touchstone::kSmolLM2Template, "<|im_start|>", "<|im_end|>"};

Manifest manifest() {
  Manifest m;
  m.path = "goldens/manifest.json";
  m.dir = "goldens";
  m.models.push_back({"m", "p", "1", "m.gguf", "m.gguf", kSha, "m.h5", "", {}, ""});
  m.cases.push_back(ManifestCase{"plain", "m", "Once upon a time", false, 4, {}, "", {}, {}});
  m.cases.push_back(ManifestCase{"chat", "m", "Hi!", true, 3, {}, "", {}, {}});
  m.scoring.push_back({"passage", "m", "passages/p.txt", "The passage.\n", 0, {}});
  return m;
}

// What the recorder would have written for `m` (shapes only as far as the check reads).
GoldenFile recorded(const Manifest& m) {
  GoldenFile g;
  g.model_name = "m";
  g.model_sha256 = kSha;
  for (const ManifestCase& c : m.cases) {
    GoldenCase gc;
    gc.name = c.name;
    gc.chat = c.chat;
    gc.prompt_text = touchstone::case_prompt_text(c, kChat);
    gc.greedy_ids.assign(static_cast<size_t>(c.n_predict), 0);
    g.cases.push_back(gc);
  }
  touchstone::GoldenScoring s;
  s.name = "passage";
  s.text = "The passage.\n";
  g.scoring.push_back(s);
  return g;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

}  // namespace

TEST(StaleGolden, FreshGoldenHasNoReasons) {
  const Manifest m = manifest();
  const GoldenFile g = recorded(m);
  EXPECT_TRUE(touchstone::stale_golden_reasons(m, m.models[0], g, kChat).empty());
  EXPECT_NO_THROW(touchstone::require_fresh_golden(m, m.models[0], g, kChat));
  // The chat case's recorded prompt is the ChatML rendering, not the raw prompt.
  EXPECT_EQ(g.cases[1].prompt_text, touchstone::chatml_prompt("Hi!"));
}

TEST(StaleGolden, EditedPromptIsStale) {
  Manifest m = manifest();
  const GoldenFile g = recorded(m);
  m.cases[0].prompt = "Once upon a tide";
  const auto reasons = touchstone::stale_golden_reasons(m, m.models[0], g, kChat);
  ASSERT_EQ(reasons.size(), 1u) << joined(reasons);
  EXPECT_NE(reasons[0].find("stale golden: case 'plain': prompt differs"), std::string::npos)
      << reasons[0];
  EXPECT_NE(reasons[0].find("byte 14"), std::string::npos) << reasons[0];
  try {
    touchstone::require_fresh_golden(m, m.models[0], g, kChat);
    ADD_FAILURE() << "no error";
  } catch (const touchstone::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("goldens/m.h5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("re-record with `touchstone golden"), std::string::npos) << msg;
  }
  // An edited chat prompt is stale too (compared after templating).
  m = manifest();
  m.cases[1].prompt = "Hello!";
  EXPECT_EQ(touchstone::stale_golden_reasons(m, m.models[0], g, kChat).size(), 1u);
}

TEST(StaleGolden, ChatFlagStepsModelAndPassageAreCompared) {
  Manifest m = manifest();
  const GoldenFile g = recorded(m);
  m.cases[0].chat = true;  // also changes the rendered prompt
  m.cases[1].n_predict = 5;
  m.models[0].sha256 = std::string(64, 'b');
  m.scoring[0].text = "Another passage.\n";
  m.cases.push_back(ManifestCase{"new", "m", "x", false, 1, {}, "", {}, {}});
  const std::string all = joined(touchstone::stale_golden_reasons(m, m.models[0], g, kChat));
  for (const char* part :
       {"case 'plain': chat is true in the manifest, false in the golden",
        "case 'plain': prompt differs",
        "case 'chat': n_predict is 5 in the manifest, the golden has 3 greedy steps", "sha256",
        "scoring passage 'passage': text differs",
        "case 'new' is in the manifest but not in the golden"})
    EXPECT_NE(all.find(part), std::string::npos) << part << "\n" << all;
  // Upper-case hex in the manifest is the same hash.
  m = manifest();
  m.models[0].sha256 = std::string(64, 'A');
  EXPECT_TRUE(touchstone::stale_golden_reasons(m, m.models[0], g, kChat).empty());
}

// A run checks only what it reads: a chat case whose template cannot be
// rendered does not stop a run of the plain case.
TEST(StaleGolden, OnlyTheSelectedCasesAreRendered) {
  const Manifest m = manifest();
  const GoldenFile g = recorded(m);
  const touchstone::ChatTemplate broken{"{{ raise_exception('no user role') }}", "", ""};
  const std::vector<std::string> only = {"plain", "passage"};
  EXPECT_TRUE(touchstone::stale_golden_reasons(m, m.models[0], g, broken, &only).empty());
  EXPECT_THROW(touchstone::stale_golden_reasons(m, m.models[0], g, broken), touchstone::Error);
}
