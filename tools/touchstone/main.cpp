// touchstone - does backend X compute the same thing as the model?
//   touchstone run     greedy generation with any backend
//   touchstone golden  (re)record goldens with the reference, or --check them
//   touchstone parity  compare a backend with the goldens
//   touchstone list    the manifest's models, cases and scoring passages
#include <fmt/format.h>

#include <exception>

#include "cli_common.h"
#include "touchstone/report/report.h"
#include "touchstone/run/build_info.h"

int main(int argc, char** argv) {
  CLI::App app{"Touchstone: parity harness for LLM inference backends"};
  app.require_subcommand(1);
  app.set_version_flag("--version",
                       fmt::format("touchstone {} (revision {})", touchstone::touchstone_version(),
                                   touchstone::touchstone_revision()),
                       "Print the version and the source revision it was built from, then exit");
  app.footer(touchstone::cli::kExitCodesHelp);
  int exit_code = 0;
  touchstone::cli::add_run(app, exit_code);
  touchstone::cli::add_golden(app, exit_code);
  touchstone::cli::add_parity(app, exit_code);
  touchstone::cli::add_export(app, exit_code);
  touchstone::cli::add_summary(app, exit_code);
  touchstone::cli::add_merge(app, exit_code);
  touchstone::cli::add_matrix(app, exit_code);
  touchstone::cli::add_info(app, exit_code);
  touchstone::cli::add_tokenize(app, exit_code);
  touchstone::cli::add_image(app, exit_code);
  touchstone::cli::add_list(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : touchstone::cli::kExitError;
  } catch (const touchstone::BackendError& e) {
    if (e.status() == TS_ERR_DEVICE) {
      fmt::print("SKIP: {}\n", touchstone::terminal_text(e.what()));
      return touchstone::cli::kExitSkip;
    }
    fmt::print(stderr, "touchstone: error: {}\n", e.what());
    return touchstone::cli::kExitError;
  } catch (const std::exception& e) {
    fmt::print(stderr, "touchstone: error: {}\n", e.what());
    return touchstone::cli::kExitError;
  }
  return exit_code;
}
