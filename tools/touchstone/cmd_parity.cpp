// touchstone parity [--backend NAME|PATH] [--suite default] [--case C]... [--weights ...]
// Runs the backend on every case of the suite, prints the report table, writes
// JSON / JUnit XML, exits 1 on failure.
#include <fmt/format.h>

#include <algorithm>

#include "cli_common.h"
#include "touchstone/error.h"
#include "touchstone/golden.h"
#include "touchstone/model_store.h"
#include "touchstone/parity.h"
#include "touchstone/report.h"

namespace touchstone::cli {

void add_parity(CLI::App& app, int& exit_code) {
  struct Opts {
    std::string manifest = default_manifest_path(), backend = "reference", suite = "default";
    std::string weights = "full_precision", profile, fault, json, junit;
    std::vector<std::string> cases, scoring;
    bool no_scoring = false, expect_fail = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand("parity", "Compare a backend with the goldens");
  cmd->add_option("--backend,-b", o->backend,
                  "Backend name (libtouchstone_backend_NAME.so) or library path");
  cmd->add_option("--suite", o->suite, "Suite from the manifest");
  cmd->add_option("--case", o->cases, "Only these cases (repeatable)");
  cmd->add_option("--scoring", o->scoring, "Only these scoring passages (repeatable)");
  cmd->add_flag("--no-scoring", o->no_scoring, "Skip the teacher-forced scoring passages");
  cmd->add_option("--weights", o->weights, "full_precision | quantized");
  cmd->add_option("--profile", o->profile,
                  "Tolerance profile (default: exact for full_precision, quantized otherwise)");
  cmd->add_option("--threads,-t", o->threads, "Threads (0 = backend default)");
  cmd->add_option("--fault", o->fault, "Test only: inject a named fault into the backend");
  cmd->add_flag("--expect-fail", o->expect_fail,
                "Test only: succeed iff the verdict is FAIL and every failing case names its first "
                "divergent step");
  cmd->add_option("--json", o->json, "Write the report as JSON here");
  cmd->add_option("--junit", o->junit, "Write the report as JUnit XML here");
  cmd->add_option("--manifest", o->manifest, "goldens/manifest.json");
  cmd->callback([o, &exit_code] {
    const Manifest m = load_manifest(o->manifest);
    const Suite& suite = m.find_suite(o->suite);
    std::vector<std::string> case_names = o->cases.empty() ? suite.cases : o->cases;
    std::vector<std::string> scoring_names = o->scoring.empty() ? suite.scoring : o->scoring;
    if (o->no_scoring) scoring_names.clear();
    // Naming cases or passages selects just those; naming neither runs the whole suite.
    if (!o->cases.empty() && o->scoring.empty()) scoring_names.clear();
    if (o->cases.empty() && !o->scoring.empty()) case_names.clear();
    const ts_weight_path wp = parse_weight_path(o->weights);
    const Profile& profile = m.find_profile(
        !o->profile.empty() ? o->profile : (wp == TS_WEIGHTS_QUANTIZED ? "quantized" : "exact"));

    // All cases of a run must use one model.
    std::string model_name;
    for (const auto& n : case_names) model_name = m.find_case(n).model;
    for (const auto& n : scoring_names) model_name = m.find_scoring(n).model;
    if (model_name.empty()) throw Error("nothing to run: the selection has no cases or passages");
    const ManifestModel& mm = m.find_model(model_name);
    const std::string model_path = resolve_model(mm);
    const GoldenFile golden = read_golden_file(m.resolve(mm.golden));
    if (golden.model_sha256 != mm.sha256) {
      throw Error("{}: goldens were recorded for model sha256 {}, manifest says {}",
                  m.resolve(mm.golden), golden.model_sha256, mm.sha256);
    }
    Tokenizer tok = load_tokenizer(model_path);
    auto lib = BackendLibrary::load(o->backend);
    const ts_capabilities caps = lib->capabilities();
    Model model(lib, model_path);
    Session session(model, SessionOptions{wp, o->threads, 0, o->fault});

    Report report;
    report.info = RunInfo{lib->name(),
                          lib->path(),
                          lib->device_name(),
                          weight_path_name(wp),
                          profile.name,
                          suite.name,
                          mm.name,
                          mm.sha256,
                          o->threads};
    for (const std::string& n : case_names) {
      const ManifestCase& mc = m.find_case(n);
      if (mc.model != mm.name)
        throw Error("case '{}' uses model '{}', not '{}'", n, mc.model, mm.name);
      const GoldenCase* gc = golden.find_case(n);
      if (!gc)
        throw Error("{}: no golden for case '{}' (run `touchstone golden`)", m.resolve(mm.golden),
                    n);
      report.cases.push_back(check_case(session, tok, *gc, profile));
      const CaseResult& r = report.cases.back();
      fmt::print(stderr, "  {:<22} {} ({:.1f} s)\n", n, r.passed ? "PASS" : "FAIL", r.seconds);
    }
    for (const std::string& n : scoring_names) {
      const GoldenScoring* gs = golden.find_scoring(n);
      if (!gs) throw Error("{}: no golden for scoring passage '{}'", m.resolve(mm.golden), n);
      report.scoring.push_back(
          check_scoring(session, *gs, profile, (caps.flags & TS_CAP_ALL_POSITION_LOGITS) != 0));
      fmt::print(stderr, "  {:<22} {} ({:.1f} s)\n", n,
                 report.scoring.back().passed ? "PASS" : "FAIL", report.scoring.back().seconds);
    }
    fmt::print("{}", format_table(report));
    if (!o->json.empty()) write_file_atomic(o->json, to_json(report));
    if (!o->junit.empty()) write_file_atomic(o->junit, to_junit(report));

    if (!o->expect_fail) {
      exit_code = report.passed() ? 0 : kExitFail;
      return;
    }
    // --expect-fail: the harness must catch the fault and say where.
    bool caught = !report.passed();
    for (const CaseResult& c : report.cases) {
      const bool named = (c.first_divergence && !c.first_divergence->accepted) ||
                         c.first_logit_violation_step >= 0;
      if (!c.passed && !named) caught = false;
    }
    fmt::print("expect-fail: fault {} {}\n", o->fault.empty() ? "(none)" : o->fault,
               caught ? "was caught, first divergent steps named" : "was NOT caught");
    exit_code = caught ? 0 : kExitFail;
  });
}

}  // namespace touchstone::cli
