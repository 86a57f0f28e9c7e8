// touchstone info --backend X [--model M.gguf]: what a backend says about itself
// (identity, device, capabilities, the model families and features it declares,
// ABI v3) and, with --model, whether it computes that model and if not, why.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli_common.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/quant.h"
#include "touchstone/run/backend_identity.h"
#include "touchstone/run/model_support.h"
#include "touchstone/runtime/backend.h"

namespace touchstone::cli {
namespace {

void print_info(BackendLibrary& lib, const std::string& model) {
  const protocol::BackendInfo& info = lib.channel().info();
  fmt::print("backend        {} {} (api_version {})\n", lib.name(), lib.version(),
             lib.api_version());
  fmt::print("library        {}\n", lib.path());
  fmt::print("device         {}\n", lib.device_name());
  try {
    const ts_capabilities c = lib.capabilities();
    fmt::print("capabilities   {}\n", joined_or_none(capability_flag_names(c.flags)));
    fmt::print("weight types   {}\n", joined_or_none(weight_type_names(c.weight_types)));
    if (c.flags & TS_CAP_TOP_N_LOGPROBS) {
      fmt::print("logits rows    top-{} log-probabilities, -inf elsewhere (ABI v5)\n", c.top_n);
    }
  } catch (const std::exception& e) {
    fmt::print("capabilities   unavailable: {}\n", e.what());
  }
  if (info.declares_models) {
    fmt::print("architectures  {}\n", info.architectures);
    fmt::print("features       {}\n",
               info.model_features.empty() ? "(plain Llama only)" : info.model_features);
  } else {
    fmt::print("architectures  not declared (api_version < 3 or NULL): load_model decides\n");
  }
  if (model.empty()) return;
  const ModelConfig c = read_model_config(gguf::File::open_metadata(model));
  fmt::print("model          {}: architecture '{}', features: {}\n", model, c.architecture,
             c.feature_names().empty() ? "none beyond plain Llama"
                                       : fmt::format("{}", fmt::join(c.feature_names(), ",")));
  const auto why = undeclared_model_support(lib, model);
  fmt::print("computes it    {}\n", why ? "no: " + *why : "yes (as declared)");
}

}  // namespace

void add_info(CLI::App& app, int& exit_code) {
  struct Opts {
    std::string backend = "reference", model;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "info", "What a backend declares: device, capabilities, architectures and features");
  cmd->add_option("--backend,-b", o->backend, "Backend name or library path");
  cmd->add_option("--model,-m", o->model, "Also say whether the backend computes this GGUF");
  cmd->callback([o, &exit_code] {
    auto lib = BackendLibrary::spawn(o->backend, ChildOptions{60.0, ""});
    print_info(*lib, o->model);
    exit_code = 0;
  });
}

}  // namespace touchstone::cli
