#include "own_model.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/golden/manifest.h"
#include "touchstone/harness/model_store.h"

namespace touchstone::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("{}: cannot read", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string safe_name(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  return s.empty() ? "model" : s;
}

// The scoring passages: text or text_file -> DIR/passages/<name>.txt.
void copy_passages(ordered_json& scoring, const std::string& cases_path, const fs::path& out,
                   const std::string& name) {
  for (size_t i = 0; i < scoring.size(); ++i) {
    ordered_json& s = scoring[i];
    const std::string ptr = "/scoring/" + std::to_string(i);
    if (!s.is_object() || !s.contains("name") || !s["name"].is_string())
      throw Error("{}: {}: expected an object with a string \"name\"", cases_path, ptr);
    std::string text;
    if (s.contains("text") && s["text"].is_string()) {
      text = s["text"].get<std::string>();
      s.erase("text");
    } else if (s.contains("text_file") && s["text_file"].is_string()) {
      const fs::path f = fs::path(fileio::dir_of(cases_path)) / s["text_file"].get<std::string>();
      text = read_text(f.string());
    } else {
      throw Error("{}: {}: needs \"text\" or \"text_file\"", cases_path, ptr);
    }
    const std::string file = "passages/" + safe_name(s["name"].get<std::string>()) + ".txt";
    fs::create_directories(out / "passages");
    fileio::write_atomic((out / file).string(), text);
    s["text_file"] = file;
    s["model"] = name;
  }
}

// An image case (docs/vision.md): its PNG and mmproj, relative to the cases file, as
// absolute paths (the manifest lives in --out), and their sha256 filled in where the
// cases file leaves them out (given ones are kept, and checked when recording).
void place_image_files(ordered_json& image, const std::string& cases_path, const std::string& ptr) {
  if (!image.is_object()) throw Error("{}: {}/image: expected an object", cases_path, ptr);
  for (const char* key : {"file", "mmproj"}) {
    if (!image.contains(key) || !image[key].is_string())
      throw Error("{}: {}/image: needs a string \"{}\"", cases_path, ptr, key);
    const fs::path f = fs::path(fileio::dir_of(cases_path)) / image[key].get<std::string>();
    if (!fs::is_regular_file(f))
      throw Error("{}: {}/image/{}: no such file {}", cases_path, ptr, key, f.string());
    image[key] = fs::absolute(f).lexically_normal().string();
    const std::string sum = std::string(key) == "file" ? "sha256" : "mmproj_sha256";
    if (!image.contains(sum)) image[sum] = sha256_file_cached(image[key].get<std::string>());
  }
}

}  // namespace

std::string write_own_manifest(const std::string& gguf_path, const std::string& cases_path,
                               const std::string& out_dir, std::string name) {
  if (!fs::is_regular_file(gguf_path)) throw Error("{}: no such model file", gguf_path);
  if (out_dir.empty()) throw Error("--cases needs --out DIR (where the goldens go)");
  if (name.empty()) name = safe_name(fs::path(gguf_path).stem().string());
  ordered_json in;
  try {
    in = ordered_json::parse(read_text(cases_path));
  } catch (const ordered_json::exception& e) {
    throw Error("{}: invalid JSON: {}", cases_path, e.what());
  }
  if (in.is_array()) in = ordered_json{{"cases", in}};
  if (!in.is_object() || !in.contains("cases") || !in["cases"].is_array())
    throw Error("{}: expected {{\"cases\": [...]}} or an array of cases", cases_path);
  for (const auto& [key, v] : in.items()) {
    if (key != "cases" && key != "scoring" && key != "suites")
      throw Error("{}: /{}: unknown key (allowed: cases, scoring, suites)", cases_path, key);
  }
  for (size_t i = 0; i < in["cases"].size(); ++i) {
    ordered_json& c = in["cases"][i];
    if (!c.is_object()) continue;
    if (!c.contains("model")) c["model"] = name;
    if (c.contains("image"))
      place_image_files(c["image"], cases_path, "/cases/" + std::to_string(i));
    // prompt_file is relative to the cases file: inline it (load_manifest then
    // checks the case as written, prompt and prompt_file both given included).
    if (c.contains("prompt_file") && c["prompt_file"].is_string() && !c.contains("prompt")) {
      const fs::path f = fs::path(fileio::dir_of(cases_path)) / c["prompt_file"].get<std::string>();
      c["prompt"] = read_text(f.string());
      c.erase("prompt_file");
    }
  }
  const fs::path out = fs::absolute(out_dir);
  fs::create_directories(out);
  ordered_json scoring = in.value("scoring", ordered_json::array());
  if (!scoring.is_array()) throw Error("{}: /scoring: expected an array", cases_path);
  copy_passages(scoring, cases_path, out, name);

  ordered_json m;
  m["format_version"] = 1;
  m["models"] = ordered_json::array({ordered_json{{"name", name},
                                                  {"path", fs::absolute(gguf_path).string()},
                                                  {"filename", fs::path(gguf_path).filename()},
                                                  {"sha256", sha256_file_cached(gguf_path)},
                                                  {"golden", name + ".h5"}}});
  m["profiles"] = ordered_json::parse(default_profiles_json());
  m["cases"] = in["cases"];
  if (!scoring.empty()) m["scoring"] = scoring;
  if (in.contains("suites")) m["suites"] = in["suites"];

  // Validate before replacing anything: the errors name CASES.json.
  const std::string path = (out / "manifest.json").string();
  const std::string tmp = (out / (".manifest.json.check-" + std::to_string(::getpid()))).string();
  fileio::write_atomic(tmp, m.dump(2) + "\n");
  try {
    load_manifest(tmp);
  } catch (const Error& e) {
    fs::remove(tmp);
    std::string msg = e.what();
    if (msg.rfind(tmp, 0) == 0) msg = msg.substr(tmp.size());
    throw Error("{} (as a manifest){}", cases_path, msg);
  }
  fs::rename(tmp, path);
  return path;
}

}  // namespace touchstone::cli
