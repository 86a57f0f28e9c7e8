#include "cli_common.h"

#include <cstdio>
#include <filesystem>

#include "touchstone/error.h"
#include "touchstone/gguf.h"

namespace touchstone::cli {

std::string default_manifest_path() {
  // Prefer the working directory (a checkout), then the source tree this binary was built from.
  if (std::filesystem::exists("goldens/manifest.json")) return "goldens/manifest.json";
  return std::string(TOUCHSTONE_SOURCE_DIR) + "/goldens/manifest.json";
}

Tokenizer load_tokenizer(const std::string& gguf_path) {
  return Tokenizer(tokenizer_data_from_gguf(gguf::File::open(gguf_path)));
}

std::string source_revision() {
  const std::string cmd = std::string("git -C '") + TOUCHSTONE_SOURCE_DIR +
                          "' describe --always --dirty --abbrev=40 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "unknown";
  char buf[128] = {};
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

ts_weight_path parse_weight_path(const std::string& s) {
  if (s == "full_precision" || s == "fp32") return TS_WEIGHTS_FULL_PRECISION;
  if (s == "quantized") return TS_WEIGHTS_QUANTIZED;
  throw Error("--weights: '{}' is not one of full_precision, quantized", s);
}

const char* weight_path_name(ts_weight_path w) {
  return w == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision";
}

}  // namespace touchstone::cli
