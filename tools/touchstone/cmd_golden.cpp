// touchstone golden [--check] : records goldens with the reference backend, or
// checks that a fresh reference run reproduces the committed goldens bit for bit.
#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "golden_parts.h"
#include "own_model.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/golden/golden.h"
#include "touchstone/harness/model_store.h"
#include "touchstone/harness/recorder.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/run/model_facts.h"

namespace touchstone::cli {
namespace {

void progress_line(const std::string& what, int done, int total) {
  constexpr int kWidth = 30;
  const int filled = total > 0 ? done * kWidth / total : kWidth;
  fmt::print(stderr, "\r  [{:<{}}] {:>4}/{:<4} {:<28}", std::string(size_t(filled), '#'), kWidth,
             done, total, what);
  if (done == total) fmt::print(stderr, "\n");
}

// Recording needs an exact revision: a dirty or unknown one only with --allow-dirty.
void require_clean_revision(const std::string& revision, const Manifest& m, bool allow_dirty) {
  const bool dirty = revision.ends_with("-dirty");
  if (allow_dirty || (!dirty && revision != "unknown")) return;
  if (dirty)
    throw Error(
        "the git checkout holding {} has uncommitted changes (revision {}); a golden "
        "records the exact revision it was made from: commit first, or pass --allow-dirty",
        m.path, revision);
  throw Error(
      "cannot determine the git revision of the checkout holding {}; a golden records the "
      "exact revision it was made from: record inside a git checkout, or pass "
      "--allow-dirty",
      m.path);
}

// Where the golden of `mm` is written: next to the manifest, or under --out.
std::string golden_path(const Manifest& m, const ManifestModel& mm, const std::string& out_dir) {
  return out_dir.empty() ? m.resolve(mm.golden)
                         : (std::filesystem::path(out_dir) / mm.golden).string();
}

// Checked before the (minutes-long) recording: every golden's directory exists
// and is writable. Also removes temp files of killed writers there.
void prepare_output(const Manifest& m, const std::string& out_dir) {
  for (const std::string& stale : fileio::remove_stale_temps(m.path))
    fmt::print(stderr, "removed stale temp file {}\n", stale);
  for (const ManifestModel& mm : m.models) {
    const std::string path = golden_path(m, mm, out_dir), dir = fileio::dir_of(path);
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw Error("{}: cannot write {} there: not an existing directory", dir, path);
    if (::access(dir.c_str(), W_OK) != 0)
      throw Error("{}: cannot write {} there: {}", dir, path, std::strerror(errno));
    for (const std::string& stale : remove_stale_golden_temps(path))
      fmt::print(stderr, "removed stale temp file {}\n", stale);
  }
}

// Writes the golden (crash-safe) and, when it replaces the committed one,
// updates the manifest's golden_sha256 pin.
void write_and_pin(const Manifest& m, const ManifestModel& mm, const GoldenFile& g,
                   const std::string& out_dir) {
  const std::string path = golden_path(m, mm, out_dir);
  write_golden_file(path, g);
  const std::string sha = sha256_file(path);
  fmt::print("wrote {} ({} cases, {} scoring passages, {:.1f} MB, sha256 {})\n", path,
             g.cases.size(), g.scoring.size(), double(std::filesystem::file_size(path)) / 1e6, sha);
  if (!out_dir.empty()) {
    fmt::print("not pinned: written outside the manifest's directory; its golden_sha256 is {}\n",
               sha);
  } else if (sha != mm.golden_sha256) {
    pin_golden_sha256(m.path, mm.name, sha);
    fmt::print("pinned {}: models/{}/golden_sha256 = {}\n", m.path, mm.name, sha);
  }
}

// What --check leaves out: items with a tag in skip_tags (--skip-tag), and,
// with a suite (--suite), the items that suite does not name.
struct CheckSelection {
  std::vector<std::string> skip_tags;
  const Suite* suite = nullptr;
  std::vector<std::string> only;  // --only: these names alone ("" = every item)

  bool skipped(const std::string& name, const std::vector<std::string>& tags, bool scoring) const {
    if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) return true;
    for (const std::string& t : tags)
      if (std::find(skip_tags.begin(), skip_tags.end(), t) != skip_tags.end()) return true;
    if (suite == nullptr) return false;
    const std::vector<std::string>& names = scoring ? suite->scoring : suite->cases;
    return std::find(names.begin(), names.end(), name) == names.end();
  }
};

// Runs every case and scoring passage of `mm` through the recording backend,
// but those `sel` leaves out (--check --skip-tag / --suite), whose names go to *left_out.
GoldenFile record_model(const std::shared_ptr<BackendLibrary>& lib, const Manifest& m,
                        const ManifestModel& mm, const std::string& revision, int threads,
                        const CheckSelection& sel, std::vector<std::string>* left_out) {
  const std::string model_path = resolve_model(mm);
  const ModelFacts& facts = model_facts(model_path);
  Tokenizer tok(facts.tokenizer);
  const ChatTemplate& chat = facts.chat;
  BackendModel model(lib, model_path);
  BackendSession session(model, BackendSessionOptions{TS_WEIGHTS_FULL_PRECISION, threads, 0, ""});
  GoldenFile g;
  g.model_name = mm.name;
  g.model_sha256 = mm.sha256;
  g.reference_version = lib->name() + " " + lib->version();
  g.reference_revision = revision;
  RecordOptions ropt;
  {
    // No config: the reference cannot describe the model; reading it again says why.
    const ModelConfig cfg =
        facts.config ? *facts.config : read_model_config(gguf::File::open_metadata(model_path));
    ropt.tap_layers = cfg.n_layer;
    ropt.tap_dim = cfg.n_embd;
  }
  for (const ManifestCase& c : m.cases) {
    if (c.model != mm.name) continue;
    if (sel.skipped(c.name, c.tags, false)) {
      left_out->push_back(c.name);
      continue;
    }
    // An image case (format 3, several frames 4): the recording backend's own tower.
    std::optional<CaseImage> image;
    if (c.has_image()) image = prepare_case_image(m, c, model);
    try {
      g.cases.push_back(record_case(
          session, tok, chat, c, ropt, [&](int d, int t) { progress_line("case " + c.name, d, t); },
          image ? &*image : nullptr));
      g.format_version = g.needed_format();
    } catch (const BackendError& e) {
      if (e.status() != TS_ERR_CONTEXT_FULL) throw;
      // Name what did not fit: an image's tokens count as prompt positions.
      const std::string what =
          image ? fmt::format("the prompt with its image ({}: {} tokens from {})", c.image.file,
                              image->n_tokens, c.image.mmproj)
                : std::string("the prompt");
      throw Error("{}: case '{}': {} and its {} steps do not fit the model's context: {}", m.path,
                  c.name, what, c.n_predict, e.what());
    }
  }
  for (const ManifestScoring& s : m.scoring) {
    if (s.model != mm.name) continue;
    if (sel.skipped(s.name, s.tags, true)) {
      left_out->push_back(s.name);
      continue;
    }
    progress_line("scoring " + s.name, 0, 1);
    g.scoring.push_back(record_scoring(session, tok, s, ropt));
    progress_line("scoring " + s.name, 1, 1);
  }
  return g;
}

// --check: the fresh recording `g` against the committed (pinned) golden;
// prints every difference, true when identical.
bool check_model(const Manifest& m, const ManifestModel& mm, GoldenFile g, bool trust_goldens,
                 const std::vector<std::string>& left_out) {
  const std::string committed = m.resolve(mm.golden);
  GoldenFile old = read_pinned_golden(m, mm, trust_goldens);
  auto left = [&](const auto& item) {
    return std::find(left_out.begin(), left_out.end(), item.name) != left_out.end();
  };
  std::erase_if(old.cases, left);
  std::erase_if(old.scoring, left);
  for (const std::string& n : left_out)
    fmt::print("{}: '{}' not checked (--skip-tag / --suite)\n", committed, n);
  if (old.reference_revision != g.reference_revision)
    fmt::print(stderr, "note: goldens recorded at revision {}, checking at {}\n",
               old.reference_revision, g.reference_revision);
  g.reference_revision = old.reference_revision;  // provenance, not data
  const std::vector<std::string> diffs = diff_golden(old, g);
  for (const std::string& d : diffs) fmt::print("DIFF {}: {}\n", committed, d);
  if (diffs.empty()) fmt::print("{}: reproduced bit for bit\n", committed);
  return diffs.empty();
}

// --only without --check: the items recorded now replace their namesakes in
// the committed golden, every other item of the model is kept as committed
// (bit for bit), in manifest order. An item in neither is an error naming it.
GoldenFile merge_with_committed(const Manifest& m, const ManifestModel& mm, GoldenFile fresh) {
  const GoldenFile old = read_pinned_golden(m, mm, /*trust_goldens=*/false);
  GoldenFile g = fresh;
  g.cases.clear();
  g.scoring.clear();
  for (const ManifestCase& c : m.cases) {
    if (c.model != mm.name) continue;
    const GoldenCase* x = fresh.find_case(c.name);
    if (x == nullptr) x = old.find_case(c.name);
    if (x == nullptr)
      throw Error("golden --only: case '{}' is neither recorded now nor in {}", c.name,
                  m.resolve(mm.golden));
    g.cases.push_back(*x);
  }
  for (const ManifestScoring& s : m.scoring) {
    if (s.model != mm.name) continue;
    const GoldenScoring* x = fresh.find_scoring(s.name);
    if (x == nullptr) x = old.find_scoring(s.name);
    if (x == nullptr)
      throw Error("golden --only: scoring passage '{}' is neither recorded now nor in {}", s.name,
                  m.resolve(mm.golden));
    g.scoring.push_back(*x);
  }
  g.format_version = g.needed_format();
  return g;
}

}  // namespace

void add_golden(CLI::App& app, int& exit_code) {
  struct Opts {
    std::string manifest = default_manifest_path(), backend = "reference", out, model, cases, name,
                suite;
    bool check = false, trust_goldens = false, allow_dirty = false;
    int threads = 0;
    std::vector<std::string> skip_tags, only, merge;
    std::string part;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "golden", "Record the goldens with the reference backend (or --check them)");
  cmd->add_flag("--check", o->check,
                "Recompute and compare bit-for-bit with the committed goldens; write nothing");
  cmd->add_option("--manifest", o->manifest, "goldens/manifest.json");
  cmd->add_option("--backend", o->backend, "Recording backend (the reference)");
  cmd->add_option("--model", o->model,
                  "Record (or --check) only this manifest model; with --cases: a GGUF file");
  cmd->add_option(
      "--cases", o->cases,
      "Your own model: cases (and scoring passages) JSON for the GGUF given by --model; "
      "writes --out DIR/manifest.json and DIR/<name>.h5 (docs/own-model.md)");
  cmd->add_option("--name", o->name, "With --cases: the model's name (default: the file's stem)");
  cmd->add_option("--out", o->out, "Directory to write golden files to (default: the manifest's)");
  cmd->add_option("--threads,-t", o->threads,
                  "Threads (0 = all cores; results do not depend on it)")
      ->check(CLI::Range(0, 4096));
  cmd->add_flag("--trust-goldens", o->trust_goldens,
                "--check: read the committed goldens without their sha256 pin / header check");
  cmd->add_option("--skip-tag", o->skip_tags,
                  "--check: leave out the cases and passages with this tag (repeatable; e.g. "
                  "long_context: ~10-25 min each on the reference)")
      ->needs(cmd->get_option("--check"));
  cmd->add_option("--suite", o->suite,
                  "--check: only the cases and passages this manifest suite names, each checked "
                  "whole (the suite's step and position trims do not apply)")
      ->needs(cmd->get_option("--check"));
  cmd->add_option("--only", o->only,
                  "Record (or --check) only these cases and passages (repeatable); recording "
                  "keeps the model's other items as committed");
  cmd->add_option("--part", o->part,
                  "With --only and --model: write the items recorded now to this file (one part "
                  "of a model's goldens recorded by case, e.g. on several hosts; not pinned)")
      ->needs(cmd->get_option("--only"))
      ->needs(cmd->get_option("--model"))
      ->excludes(cmd->get_option("--check"));
  cmd->add_option("--merge", o->merge,
                  "Assemble a model's golden from --part files (every item in exactly one, one "
                  "reference revision) and write and pin it as a recording would")
      ->excludes(cmd->get_option("--check"))
      ->excludes(cmd->get_option("--only"))
      ->excludes(cmd->get_option("--cases"));
  cmd->add_flag("--allow-dirty", o->allow_dirty,
                "Record from a checkout with uncommitted changes (the golden says '-dirty')");
  cmd->callback([o, &exit_code] {
    const bool own = !o->cases.empty();
    if (own) {  // the user's own model: a manifest of its own under --out, goldens beside it
      o->manifest = write_own_manifest(o->model, o->cases, o->out, o->name);
      fmt::print(stderr, "wrote {}\n", o->manifest);
      o->model.clear();
      o->out.clear();
    }
    const Manifest m = load_manifest(o->manifest);
    if (!o->merge.empty()) {  // no recording: the parts carry their revision
      prepare_output(m, o->out);
      const ManifestModel* mm = nullptr;
      const GoldenFile g = merge_golden_parts(m, o->merge, &mm);
      write_and_pin(m, *mm, g, o->out);
      return;
    }
    const std::string revision = source_revision(o->manifest);
    if (!o->check) {
      if (!own) require_clean_revision(revision, m, o->allow_dirty);
      prepare_output(m, o->out);
    }
    auto lib = BackendLibrary::load(o->backend);
    bool all_same = true;
    if (!o->model.empty()) m.find_model(o->model);  // an unknown name is an error
    CheckSelection sel{o->skip_tags, o->suite.empty() ? nullptr : &m.find_suite(o->suite), o->only};
    for (const ManifestModel& mm : m.models) {
      if (!o->model.empty() && mm.name != o->model) continue;
      fmt::print(stderr, "{} goldens for {} with {} ({})\n", o->check ? "checking" : "recording",
                 mm.name, lib->name(), lib->device_name());
      std::vector<std::string> left_out;
      GoldenFile g = record_model(lib, m, mm, revision, o->threads, sel, &left_out);
      if (!o->part.empty()) {
        write_golden_file(o->part, g);
        fmt::print("wrote part {} ({} cases, {} scoring passages; merge with golden --merge)\n",
                   o->part, g.cases.size(), g.scoring.size());
        continue;
      }
      if (!o->check && !o->only.empty()) g = merge_with_committed(m, mm, std::move(g));
      if (o->check)
        all_same = check_model(m, mm, std::move(g), o->trust_goldens, left_out) && all_same;
      else
        write_and_pin(m, mm, g, o->out);
    }
    exit_code = all_same ? 0 : kExitFail;
  });
}

}  // namespace touchstone::cli
