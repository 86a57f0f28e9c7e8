// The golden's integrity: the checksum header in the user block and the
// manifest's golden_sha256 pin, both checked before libhdf5 sees a byte.
#include "golden_checksum.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <algorithm>
#include <array>

#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/golden/golden.h"

namespace touchstone {

using detail::kUserBlockSize;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [&](char x, char y) { return lower(x) == lower(y); });
}
constexpr std::string_view kMagic = "TOUCHSTONE-GOLDEN\n";
// The header's own layout version ("format 1": magic, size, sha256 of the HDF5
// image). It stays 1 while the HDF5 content's format_version moves (2: layer
// taps), so files of either content version verify.
constexpr int kHeaderFormat = 1;

std::string checksum_header(std::string_view bytes) {
  const std::string_view body = bytes.substr(kUserBlockSize);
  std::string h = fmt::format("{}format {}\nbytes {}\nsha256 {}\n", kMagic, kHeaderFormat,
                              body.size(), sha256_hex(body));
  h.resize(kUserBlockSize, '\0');
  return h;
}

constexpr const char* kRefusedHint =
    "refused before opening it with libhdf5; re-record it with `touchstone golden`, or pass "
    "--trust-goldens to read it anyway";

}  // namespace

namespace detail {

void verify_header(const std::string& where, std::string_view bytes, bool trust) {
  const bool has_magic = bytes.size() >= kUserBlockSize && bytes.substr(0, kMagic.size()) == kMagic;
  if (!has_magic) {
    if (trust) return;
    if (bytes.size() < kUserBlockSize)
      throw Error(
          "{}: truncated or not a golden file: {} bytes, shorter than the {}-byte "
          "TOUCHSTONE-GOLDEN header; {}",
          where, bytes.size(), kUserBlockSize, kRefusedHint);
    throw Error(
        "{}: not a valid golden file: the first bytes are not the TOUCHSTONE-GOLDEN "
        "header (damaged, or written by another tool); {}",
        where, kRefusedHint);
  }
  const std::string_view block = bytes.substr(0, kUserBlockSize);
  const std::string_view stored = block.substr(0, std::min(block.find('\0'), block.size()));
  const std::string expected = checksum_header(bytes);
  if (stored != std::string_view(expected.c_str()))
    throw Error(
        "{}: corrupted or truncated golden file: header says\n{}but the content gives\n{}{}", where,
        stored, expected.c_str(), kRefusedHint);
}

}  // namespace detail

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md.data(), &len, EVP_sha256(), nullptr) != 1)
    throw Error("sha256: OpenSSL EVP_Digest failed");
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::string stamp_golden_header(std::string bytes) {
  if (bytes.size() < kUserBlockSize)
    throw Error("stamp_golden_header: {} bytes, shorter than the {}-byte user block", bytes.size(),
                kUserBlockSize);
  const std::string header = checksum_header(bytes);
  bytes.replace(0, kUserBlockSize, header);
  return bytes;
}

GoldenFile read_pinned_golden(const Manifest& m, const ManifestModel& mm, bool trust) {
  const std::string path = m.resolve(mm.golden);
  const std::string bytes = fileio::read_file(path, "golden file");
  if (!trust) {
    const std::string actual = sha256_hex(bytes);
    if (mm.golden_sha256.empty())
      throw Error(
          "{}: model '{}' has no \"golden_sha256\", so its golden {} is not pinned; add "
          "\"golden_sha256\": \"{}\" if that file is the one you recorded (`touchstone golden` "
          "writes it), or pass --trust-goldens",
          m.path, mm.name, path, actual);
    if (!iequals(actual, mm.golden_sha256))
      throw Error(
          "{}: sha256 {} does not match the golden_sha256 {} pinned for model '{}' in {}: the "
          "golden was swapped, edited or damaged; refused before opening it with libhdf5. "
          "Re-record it with `touchstone golden` (which updates the pin), or pass "
          "--trust-goldens",
          path, actual, mm.golden_sha256, mm.name, m.path);
  }
  return parse_golden_bytes(path, bytes, trust);
}

}  // namespace touchstone
