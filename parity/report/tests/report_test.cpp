// Reports: every byte value in any report field still gives valid UTF-8 JSON
// and well-formed XML 1.0; incomplete runs never read as PASS; atomic writes.
#include "touchstone/report/report.h"
#include "touchstone/model/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace touchstone {
namespace {

// Decodes UTF-8 strictly; false on any invalid sequence.
bool valid_utf8(const std::string& s) { return sanitize_utf8(s) == s; }

// True when no character XML 1.0 forbids appears (C0 controls but tab/LF/CR,
// U+FFFE, U+FFFF) and & < only appear as escapes.
bool xml10_clean(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return false;
    if (c == 0xEF && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0xBF &&
        (static_cast<unsigned char>(s[i + 2]) == 0xBE ||
         static_cast<unsigned char>(s[i + 2]) == 0xBF))
      return false;
  }
  return true;
}

Report report_with(const std::string& text) {
  Report r;
  r.info.backend = text;
  r.info.device = text;
  CaseResult c;
  c.name = text;
  c.failures = {text};
  c.backend_error = text;
  GreedyDivergence d;
  d.ref_text = text;
  d.test_text = text;
  c.first_divergence = d;
  r.cases.push_back(c);
  r.complete = true;
  r.n_planned = 1;
  return r;
}

TEST(Report, EveryByteValueGivesValidJsonAndXml) {
  for (int b = 0; b < 256; ++b) {
    const std::string text = std::string("a") + char(b) + "\xEF\xBF\xBE" + "z";
    const Report r = report_with(text);
    const std::string json = to_json(r);
    EXPECT_TRUE(valid_utf8(json)) << "byte " << b;
    EXPECT_TRUE(nlohmann::json::accept(json)) << "byte " << b;
    const std::string xml = to_junit(r);
    EXPECT_TRUE(valid_utf8(xml)) << "byte " << b;
    EXPECT_TRUE(xml10_clean(xml)) << "byte " << b;
    EXPECT_TRUE(valid_utf8(format_table(r))) << "byte " << b;
  }
}

TEST(Report, XmlEscapeKeepsTextReadable) {
  EXPECT_EQ(xml_escape("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
  EXPECT_EQ(xml_escape(std::string("\x01", 1)), "\\x01");
  EXPECT_EQ(xml_escape("tab\tnl\n"), "tab\tnl\n");
  EXPECT_EQ(xml_escape("é"), "é");
  EXPECT_EQ(xml_escape("\xff"), "\xEF\xBF\xBD");
}

TEST(Report, SanitizeRejectsOverlongAndSurrogates) {
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong '/'
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // U+D800
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80").substr(0, 3), "\xEF\xBF\xBD");         // > U+10FFFF
  EXPECT_EQ(sanitize_utf8("日本"), "日本");
}

TEST(Report, IncompleteOrEmptyRunIsNeverPass) {
  Report r;
  r.complete = true;
  EXPECT_FALSE(r.passed());  // nothing ran
  CaseResult c;
  c.passed = true;
  r.cases.push_back(c);
  EXPECT_TRUE(r.passed());
  r.complete = false;
  EXPECT_FALSE(r.passed());
  r.n_planned = 3;
  EXPECT_NE(format_table(r).find("INCOMPLETE (1 of 3"), std::string::npos);
  EXPECT_NE(to_json(r).find("\"complete\": false"), std::string::npos);
}

TEST(Report, TerminalTextShowsEveryControlCharacter) {
  EXPECT_EQ(terminal_text("a\n\nverdict: PASS\r\t\x1b[8m\x7f\xc2\x9b\xff"),
            "a\\n\\nverdict: PASS\\r\\t\\x1b[8m\\x7f\\u{9b}\xef\xbf\xbd");
  EXPECT_EQ(terminal_text("plain \xc3\xa9"), "plain \xc3\xa9");
}

TEST(Report, AFailedRowOutranksSkipUnsupportedAndIncomplete) {
  Report r;
  CaseResult failed;
  failed.passed = false;
  r.cases.push_back(failed);
  r.skipped = "no device";
  EXPECT_EQ(r.verdict(), "FAIL");
  r.skipped.clear();
  r.unsupported = "refused";
  EXPECT_EQ(r.verdict(), "FAIL");
  r.unsupported.clear();
  EXPECT_EQ(r.verdict(), "FAIL");  // incomplete, but a row already failed
  r.cases.clear();
  r.skipped = "no device";
  EXPECT_EQ(r.verdict(), "SKIP");
}

TEST(Report, AtomicWriteReplacesAndNamesErrors) {
  const auto dir = std::filesystem::temp_directory_path() / "touchstone_report_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "r.json").string();
  write_file_atomic(path, "one");
  write_file_atomic(path, "two");
  std::ifstream f(path);
  std::string got;
  std::getline(f, got);
  EXPECT_EQ(got, "two");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename(), "r.json") << "temp file left behind";
  }
  try {
    write_file_atomic("/nonexistent-dir/r.json", "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace touchstone
