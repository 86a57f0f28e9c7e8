// touchstone-export-static-graph: writes the static_graph modules (MLIR text,
// TOSA 1.0) and their weights. See docs/backends/static_graph.md.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "export.h"

int main(int argc, char** argv) {
  touchstone::static_graph::ExportOptions opt;
  std::string model, out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model")
      model = next();
    else if (a == "--out")
      out = next();
    else if (a == "--weights")
      opt.quantized = next() == "quantized";
    else if (a == "--capacity")
      opt.capacity = std::atoi(next().c_str());
    else if (a == "--no-prefill")
      opt.with_prefill = false;
    else if (a == "--no-check")
      opt.with_reference_io = false;
    else {
      std::fprintf(stderr,
                   "usage: touchstone-export-static-graph --model M.gguf --out DIR [--weights "
                   "full_precision|quantized]\n"
                   "       [--capacity N (default 64)] [--no-prefill] [--no-check]\n");
      return 2;
    }
  }
  if (model.empty() || out.empty()) {
    std::fprintf(stderr, "--model and --out are required\n");
    return 2;
  }
  try {
    touchstone::static_graph::export_modules(model, out, opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "export failed: %s\n", e.what());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
