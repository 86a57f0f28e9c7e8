// touchstone golden [--check] : records goldens with the reference backend, or
// checks that a fresh reference run reproduces the committed goldens bit for bit.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "cli_common.h"
#include "touchstone/error.h"
#include "touchstone/golden.h"
#include "touchstone/model_store.h"
#include "touchstone/recorder.h"

namespace touchstone::cli {
namespace {

void progress_line(const std::string& what, int done, int total) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? done * kWidth / total : kWidth;
  fmt::print(stderr, "\r  [{:<{}}] {:>4}/{:<4} {:<28}", std::string(size_t(filled), '#'), kWidth,
             done, total, what);
  if (done == total) fmt::print(stderr, "\n");
}

}  // namespace

void add_golden(CLI::App& app, int& exit_code) {
  struct Opts {
    std::string manifest = default_manifest_path(), backend = "reference", out;
    bool check = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "golden", "Record the goldens with the reference backend (or --check them)");
  cmd->add_flag("--check", o->check,
                "Recompute and compare bit-for-bit with the committed goldens; write nothing");
  cmd->add_option("--manifest", o->manifest, "goldens/manifest.json");
  cmd->add_option("--backend", o->backend, "Recording backend (the reference)");
  cmd->add_option("--out", o->out, "Directory to write golden files to (default: the manifest's)");
  cmd->add_option("--threads,-t", o->threads,
                  "Threads (0 = all cores; results do not depend on it)");
  cmd->callback([o, &exit_code] {
    const Manifest m = load_manifest(o->manifest);
    auto lib = BackendLibrary::load(o->backend);
    const std::string revision = source_revision();
    const RecordOptions ropt;
    bool all_same = true;
    for (const ManifestModel& mm : m.models) {
      const std::string model_path = resolve_model(mm);
      Tokenizer tok = load_tokenizer(model_path);
      Model model(lib, model_path);
      Session session(model, SessionOptions{TS_WEIGHTS_FULL_PRECISION, o->threads, 0, ""});
      GoldenFile g;
      g.model_name = mm.name;
      g.model_sha256 = mm.sha256;
      g.reference_version = lib->name() + " " + lib->version();
      g.reference_revision = revision;
      fmt::print(stderr, "{} goldens for {} with {} ({})\n", o->check ? "checking" : "recording",
                 mm.name, lib->name(), lib->device_name());
      for (const ManifestCase& c : m.cases) {
        if (c.model != mm.name) continue;
        g.cases.push_back(record_case(
            session, tok, c, ropt, [&](int d, int t) { progress_line("case " + c.name, d, t); }));
      }
      for (const ManifestScoring& s : m.scoring) {
        if (s.model != mm.name) continue;
        progress_line("scoring " + s.name, 0, 1);
        g.scoring.push_back(record_scoring(session, tok, s, ropt));
        progress_line("scoring " + s.name, 1, 1);
      }
      const std::string committed = m.resolve(mm.golden);
      if (o->check) {
        const GoldenFile old = read_golden_file(committed);
        if (old.reference_revision != g.reference_revision) {
          fmt::print(stderr, "note: goldens recorded at revision {}, checking at {}\n",
                     old.reference_revision, g.reference_revision);
        }
        g.reference_revision = old.reference_revision;  // provenance, not data
        const std::vector<std::string> diffs = diff_golden(old, g);
        for (const std::string& d : diffs) fmt::print("DIFF {}: {}\n", committed, d);
        if (diffs.empty()) fmt::print("{}: reproduced bit for bit\n", committed);
        all_same = all_same && diffs.empty();
      } else {
        const std::string path =
            o->out.empty() ? committed : (std::filesystem::path(o->out) / mm.golden).string();
        write_golden_file(path, g);
        fmt::print("wrote {} ({} cases, {} scoring passages, {:.1f} MB)\n", path, g.cases.size(),
                   g.scoring.size(), double(std::filesystem::file_size(path)) / 1e6);
      }
    }
    exit_code = all_same ? 0 : kExitFail;
  });
}

}  // namespace touchstone::cli
