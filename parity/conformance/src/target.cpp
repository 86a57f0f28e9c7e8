// target.cpp - the contract suite's command line (touchstone/conformance/target.h).
#include "touchstone/conformance/target.h"

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <utility>

namespace touchstone::conformance {

Target parse_target(int argc, char** argv) {
  Target t;
  CLI::App app{"touchstone-contract-test: the session contract's conformance suite"};
  app.add_option("--backend", t.backend, "backend name or library path")->required();
  app.add_option("--weights", t.weights, "weight path")
      ->check(CLI::IsMember({"full_precision", "quantized"}));
  app.add_option("--model", t.model, "the GGUF the suite loads (absent: every test SKIPs)");
  app.add_option("--profile", t.profile, "manifest profile for the serving comparisons");
  app.add_option("--manifest", t.manifest, "goldens/manifest.json (with --profile)");
  app.add_flag("--child", t.child, "run the backend in touchstone-backend-runner");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw std::invalid_argument(std::string(e.get_name()) + ": " + e.what());
  }
  if (!t.profile.empty() && t.manifest.empty()) {
    throw std::invalid_argument("--profile " + t.profile + " needs --manifest");
  }
  return t;
}

namespace {
Target& storage() {
  static Target t;
  return t;
}
}  // namespace

const Target& target() { return storage(); }
void set_target(Target t) { storage() = std::move(t); }

}  // namespace touchstone::conformance
