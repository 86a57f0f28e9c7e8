#include "cli_common.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/run/model_facts.h"

namespace touchstone::cli {

std::string default_manifest_path() {
  // The project in the working directory only: never the source tree this binary was built
  // from (a bare `touchstone golden` elsewhere would rewrite that tree's goldens). When it is
  // missing, load_manifest says to pass --manifest or run from the project root.
  return "goldens/manifest.json";
}

std::string checking_manifest_path() {
  const std::string local = default_manifest_path();
  std::error_code ec;
  if (std::filesystem::exists(local, ec)) return local;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return local;
  const std::filesystem::path installed =
      exe.parent_path().parent_path() / "share" / "touchstone" / "goldens" / "manifest.json";
  return std::filesystem::exists(installed, ec) ? installed.string() : local;
}

Tokenizer load_tokenizer(const std::string& gguf_path) {
  return Tokenizer(model_facts(gguf_path).tokenizer);
}

std::string source_revision(const std::string& manifest_path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(manifest_path, ec);
  std::string dir = (ec ? std::filesystem::path(manifest_path) : abs).parent_path().string();
  if (dir.empty()) dir = ".";
  std::string quoted = "'";
  for (char c : dir) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const std::string cmd = "git -C " + quoted + " describe --always --dirty --abbrev=40 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "unknown";
  char buf[128] = {};
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return status != 0 || out.empty() ? "unknown" : out;
}

CLI::Validator finite_seconds() {
  return CLI::Validator(
      [](std::string& v) {
        double s = 0.0;
        try {
          size_t used = 0;
          s = std::stod(v, &used);
          if (used != v.size()) return std::string("seconds in (0, 1e6], not '" + v + "'");
        } catch (const std::exception&) {
          return std::string("seconds in (0, 1e6], not '" + v + "'");
        }
        return std::isfinite(s) && s >= 0.001 && s <= 1e6
                   ? std::string()
                   : std::string("seconds in (0, 1e6], not '" + v + "'");
      },
      "seconds in (0, 1e6]");
}

}  // namespace touchstone::cli
