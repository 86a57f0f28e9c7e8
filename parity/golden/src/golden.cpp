// Golden-file I/O on the HDF5 C API. Layout: docs/golden-format.md.
#include "touchstone/golden.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <set>
#include <type_traits>

#include "h5util.h"
#include "touchstone/error.h"
#include "touchstone/file_io.h"

namespace touchstone {

namespace h5 {

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {
herr_t walk_cb(unsigned n, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::string*>(data);
  if (n == 0 && err != nullptr && err->desc != nullptr) *out = err->desc;
  return 0;
}
}  // namespace

std::string take_error() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk_cb, &msg);
  H5Eclear2(H5E_DEFAULT);
  return msg;
}

}  // namespace h5

using h5::Id;

// ---------------------------------------------------------------------------
// GoldenFile lookups

const GoldenCase* GoldenFile::find_case(std::string_view n) const {
  for (const auto& c : cases)
    if (c.name == n) return &c;
  return nullptr;
}

const GoldenScoring* GoldenFile::find_scoring(std::string_view n) const {
  for (const auto& s : scoring)
    if (s.name == n) return &s;
  return nullptr;
}

// ---------------------------------------------------------------------------
// Validation

namespace {

std::string hdf5_suffix() {
  std::string d = h5::take_error();
  return d.empty() ? std::string() : " (HDF5: " + d + ")";
}

void check_name(const std::string& where, const char* kind, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    throw Error("{}: invalid {} name '{}': must be non-empty, not '.'/'..', without '/' or NUL",
                where, kind, name);
}

void check_attr_string(const std::string& where, const char* attr, const std::string& v) {
  if (v.find('\0') != std::string::npos)
    throw Error("{}: attribute {}: contains a NUL byte", where, attr);
}

void check_size(const std::string& where, const std::string& obj, size_t actual, uint64_t expected,
                const std::string& formula) {
  if (actual != expected)
    throw Error("{}: {}: has {} elements, expected {} = {}", where, obj, actual, formula, expected);
}

void check_ids(const std::string& where, const std::string& obj, const std::vector<int32_t>& ids,
               int32_t n_vocab) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= n_vocab)
      throw Error("{}: {}[{}]: token id {} out of range [0, {})", where, obj, i, ids[i], n_vocab);
}

void check_vocab_k(const std::string& where, const std::string& obj, int32_t n_vocab,
                   int32_t top_k) {
  if (n_vocab < 1) throw Error("{}: {}: attribute n_vocab = {} must be >= 1", where, obj, n_vocab);
  if (top_k < 0 || top_k > n_vocab)
    throw Error("{}: {}: attribute top_k = {} must be in [0, n_vocab = {}]", where, obj, top_k,
                n_vocab);
}

uint64_t mul(uint64_t a, uint64_t b) { return a * b; }  // operands < 2^32 each: no overflow

}  // namespace

void validate_golden(const GoldenFile& g, const std::string& where) {
  if (g.format_version != kGoldenFormatVersion)
    throw Error("{}: format_version {} is not supported (expected {})", where, g.format_version,
                kGoldenFormatVersion);
  check_attr_string(where, "model_name", g.model_name);
  check_attr_string(where, "model_sha256", g.model_sha256);
  check_attr_string(where, "reference_version", g.reference_version);
  check_attr_string(where, "reference_revision", g.reference_revision);

  std::set<std::string> seen;
  for (const auto& c : g.cases) {
    check_name(where, "case", c.name);
    const std::string obj = "/cases/" + c.name;
    if (!seen.insert(c.name).second) throw Error("{}: {}: duplicate case name", where, obj);
    check_vocab_k(where, obj, c.n_vocab, c.top_k);
    const uint64_t G = c.greedy_ids.size(), K = static_cast<uint64_t>(c.top_k),
                   V = static_cast<uint64_t>(c.n_vocab);
    if (c.n_full_steps < 0 || static_cast<uint64_t>(c.n_full_steps) > G)
      throw Error(
          "{}: {}: attribute n_full_steps = {} must be in [0, G = {}] (G = size of greedy_ids)",
          where, obj, c.n_full_steps, G);
    const uint64_t F = static_cast<uint64_t>(c.n_full_steps);
    check_size(where, obj + "/full_logits", c.full_logits.size(), mul(F, V),
               fmt::format("n_full_steps * n_vocab = {} * {}", F, V));
    check_size(where, obj + "/topk_ids", c.topk_ids.size(), mul(G, K),
               fmt::format("G * top_k = {} * {}", G, K));
    check_size(where, obj + "/topk_logits", c.topk_logits.size(), mul(G, K),
               fmt::format("G * top_k = {} * {}", G, K));
    check_size(where, obj + "/lse", c.lse.size(), G, "G");
    check_ids(where, obj + "/prompt_ids", c.prompt_ids, c.n_vocab);
    check_ids(where, obj + "/greedy_ids", c.greedy_ids, c.n_vocab);
    check_ids(where, obj + "/topk_ids", c.topk_ids, c.n_vocab);
  }

  seen.clear();
  for (const auto& s : g.scoring) {
    check_name(where, "scoring", s.name);
    const std::string obj = "/scoring/" + s.name;
    if (!seen.insert(s.name).second) throw Error("{}: {}: duplicate scoring name", where, obj);
    check_vocab_k(where, obj, s.n_vocab, s.top_k);
    const uint64_t N = s.token_ids.size(), R = N > 0 ? N - 1 : 0,
                   K = static_cast<uint64_t>(s.top_k);
    check_size(where, obj + "/topk_ids", s.topk_ids.size(), mul(R, K),
               fmt::format("(N - 1) * top_k = {} * {}", R, K));
    check_size(where, obj + "/topk_logits", s.topk_logits.size(), mul(R, K),
               fmt::format("(N - 1) * top_k = {} * {}", R, K));
    check_size(where, obj + "/lse", s.lse.size(), R, "N - 1");
    check_size(where, obj + "/target_logits", s.target_logits.size(), R, "N - 1");
    check_ids(where, obj + "/token_ids", s.token_ids, s.n_vocab);
    check_ids(where, obj + "/topk_ids", s.topk_ids, s.n_vocab);
  }
}

// ---------------------------------------------------------------------------
// Writing

namespace {

class Writer {
 public:
  explicit Writer(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& obj, const std::string& what) const {
    throw Error("{}: {}: {}{}", file_, obj, what, hdf5_suffix());
  }
  void check(herr_t r, const std::string& obj, const char* what) const {
    if (r < 0) fail(obj, what);
  }

  // Object-creation property list without modification times, so the same
  // content gives the same bytes (goldens are committed).
  Id ocpl(hid_t cls, const std::string& obj) const {
    Id p(H5Pcreate(cls), H5Pclose);
    if (!p.valid()) fail(obj, "cannot create property list");
    check(H5Pset_obj_track_times(p, false), obj, "cannot disable time tracking");
    return p;
  }

  Id group(hid_t loc, const std::string& name, const std::string& obj, bool track_order) const {
    Id gcpl = ocpl(H5P_GROUP_CREATE, obj);
    if (track_order)
      check(H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), obj,
            "cannot enable link creation order");
    Id g(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose);
    if (!g.valid()) fail(obj, "cannot create group");
    return g;
  }

  void attr_string(hid_t loc, const char* name, const std::string& v,
                   const std::string& obj) const {
    const std::string aobj = obj + "@" + name;
    Id type(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!type.valid()) fail(aobj, "cannot create string type");
    check(H5Tset_size(type, H5T_VARIABLE), aobj, "cannot set string size");
    check(H5Tset_cset(type, H5T_CSET_UTF8), aobj, "cannot set string cset");
    Id space(H5Screate(H5S_SCALAR), H5Sclose);
    if (!space.valid()) fail(aobj, "cannot create dataspace");
    Id a(H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!a.valid()) fail(aobj, "cannot create attribute");
    const char* p = v.c_str();
    check(H5Awrite(a, type, &p), aobj, "cannot write attribute");
  }

  void attr_int(hid_t loc, const char* name, int32_t v, hid_t file_type,
                const std::string& obj) const {
    const std::string aobj = obj + "@" + name;
    Id space(H5Screate(H5S_SCALAR), H5Sclose);
    if (!space.valid()) fail(aobj, "cannot create dataspace");
    Id a(H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!a.valid()) fail(aobj, "cannot create attribute");
    check(H5Awrite(a, H5T_NATIVE_INT32, &v), aobj, "cannot write attribute");
  }

  // rank-1 or rank-2 dataset; compressed (chunked + shuffle + deflate 4)
  // when `compress` or when it is large, and not empty.
  void dataset(hid_t loc, const char* name, const void* data, std::vector<hsize_t> dims,
               hid_t file_type, hid_t mem_type, const std::string& obj, bool compress) const {
    const std::string dobj = obj + "/" + name;
    hsize_t total = 1;
    for (hsize_t d : dims) total *= d;
    Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
    if (!space.valid()) fail(dobj, "cannot create dataspace");
    Id dcpl = ocpl(H5P_DATASET_CREATE, dobj);
    if (total > 0 && (compress || total >= 1024)) {
      // Chunks of whole rows, about 64 KiB or one row, whichever is larger.
      const size_t elem = H5Tget_size(file_type);
      hsize_t row = 1;
      for (size_t i = 1; i < dims.size(); ++i) row *= dims[i];
      std::vector<hsize_t> chunk = dims;
      const hsize_t rows = std::max<hsize_t>(1, (64 * 1024) / std::max<hsize_t>(1, row * elem));
      chunk[0] = std::min(dims[0], rows);
      check(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), dobj,
            "cannot set chunking");
      check(H5Pset_shuffle(dcpl), dobj, "cannot set shuffle filter");
      check(H5Pset_deflate(dcpl, 4), dobj, "cannot set deflate filter");
    }
    Id d(H5Dcreate2(loc, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
    if (!d.valid()) fail(dobj, "cannot create dataset");
    if (total > 0)
      check(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), dobj,
            "cannot write dataset");
  }

  void bytes(hid_t loc, const char* name, const std::string& s, const std::string& obj) const {
    dataset(loc, name, s.data(), {s.size()}, H5T_STD_U8LE, H5T_NATIVE_UCHAR, obj, false);
  }
  void ints(hid_t loc, const char* name, const std::vector<int32_t>& v, std::vector<hsize_t> dims,
            const std::string& obj) const {
    dataset(loc, name, v.data(), std::move(dims), H5T_STD_I32LE, H5T_NATIVE_INT32, obj, false);
  }
  void floats(hid_t loc, const char* name, const std::vector<float>& v, std::vector<hsize_t> dims,
              const std::string& obj, bool compress = false) const {
    dataset(loc, name, v.data(), std::move(dims), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, obj, compress);
  }
  void doubles(hid_t loc, const char* name, const std::vector<double>& v,
               const std::string& obj) const {
    dataset(loc, name, v.data(), {v.size()}, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, obj, false);
  }

  void write_all(hid_t file, const GoldenFile& g) const {
    attr_int(file, "format_version", g.format_version, H5T_STD_I32LE, "/");
    attr_string(file, "model_name", g.model_name, "/");
    attr_string(file, "model_sha256", g.model_sha256, "/");
    attr_string(file, "reference_version", g.reference_version, "/");
    attr_string(file, "reference_revision", g.reference_revision, "/");

    Id cases = group(file, "cases", "/cases", true);
    for (const auto& c : g.cases) {
      const std::string obj = "/cases/" + c.name;
      Id grp = group(cases, c.name, obj, false);
      const hsize_t G = c.greedy_ids.size(), K = static_cast<hsize_t>(c.top_k),
                    F = static_cast<hsize_t>(c.n_full_steps), V = static_cast<hsize_t>(c.n_vocab);
      attr_string(grp, "name", c.name, obj);
      attr_int(grp, "chat", c.chat ? 1 : 0, H5T_STD_I8LE, obj);
      attr_int(grp, "n_vocab", c.n_vocab, H5T_STD_I32LE, obj);
      attr_int(grp, "top_k", c.top_k, H5T_STD_I32LE, obj);
      attr_int(grp, "n_full_steps", c.n_full_steps, H5T_STD_I32LE, obj);
      bytes(grp, "prompt_text", c.prompt_text, obj);
      ints(grp, "prompt_ids", c.prompt_ids, {c.prompt_ids.size()}, obj);
      ints(grp, "greedy_ids", c.greedy_ids, {G}, obj);
      bytes(grp, "greedy_text", c.greedy_text, obj);
      floats(grp, "full_logits", c.full_logits, {F, V}, obj, true);
      ints(grp, "topk_ids", c.topk_ids, {G, K}, obj);
      floats(grp, "topk_logits", c.topk_logits, {G, K}, obj);
      doubles(grp, "lse", c.lse, obj);
    }

    Id scoring = group(file, "scoring", "/scoring", true);
    for (const auto& s : g.scoring) {
      const std::string obj = "/scoring/" + s.name;
      Id grp = group(scoring, s.name, obj, false);
      const hsize_t N = s.token_ids.size(), R = N > 0 ? N - 1 : 0,
                    K = static_cast<hsize_t>(s.top_k);
      attr_string(grp, "name", s.name, obj);
      attr_int(grp, "n_vocab", s.n_vocab, H5T_STD_I32LE, obj);
      attr_int(grp, "top_k", s.top_k, H5T_STD_I32LE, obj);
      bytes(grp, "text", s.text, obj);
      ints(grp, "token_ids", s.token_ids, {N}, obj);
      ints(grp, "topk_ids", s.topk_ids, {R, K}, obj);
      floats(grp, "topk_logits", s.topk_logits, {R, K}, obj);
      doubles(grp, "lse", s.lse, obj);
      floats(grp, "target_logits", s.target_logits, {R}, obj);
    }
  }

 private:
  std::string file_;
};

// The first kUserBlockSize bytes of a golden file are an HDF5 "user block"
// (ignored by HDF5, h5py, h5dump) holding a text header with the size and the
// sha256 of the rest of the file. The reader checks it before handing the
// bytes to libhdf5, which is not hardened against corrupted metadata (crafted
// files crash it, hang it or make it allocate gigabytes).
constexpr hsize_t kUserBlockSize = 512;

bool iequals(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [&](char x, char y) { return lower(x) == lower(y); });
}
constexpr std::string_view kMagic = "TOUCHSTONE-GOLDEN\n";

std::string checksum_header(std::string_view bytes) {
  const std::string_view body = bytes.substr(kUserBlockSize);
  std::string h = fmt::format("{}format {}\nbytes {}\nsha256 {}\n", kMagic, kGoldenFormatVersion,
                              body.size(), sha256_hex(body));
  h.resize(kUserBlockSize, '\0');
  return h;
}

constexpr const char* kRefusedHint =
    "refused before opening it with libhdf5; re-record it with `touchstone golden`, or pass "
    "--trust-goldens to read it anyway";

// Throws unless `bytes` start with a valid header matching the rest. With
// `trust`, a file without the header (damaged magic, another tool) passes;
// a header that is present but does not match is refused even then.
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

// Name of an in-memory HDF5 file: the core driver refuses to open an image
// under the name of a file that exists on disk, and must never touch the
// disk, so the name is one that cannot exist (a path below /dev/null).
std::string memory_name() {
  static std::atomic<unsigned long> counter{0};
  return fmt::format("/dev/null/touchstone-golden-image-{}", counter++);
}

// Opens an HDF5 image held in memory (core driver, no backing store).
Id open_image(const std::string& where, const std::string& bytes) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid())
    throw Error("{}: cannot create file access property list{}", where, hdf5_suffix());
  if (H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0 ||
      H5Pset_fapl_core(fapl, 1 << 20, /*backing_store=*/false) < 0 ||
      H5Pset_file_image(fapl, const_cast<char*>(bytes.data()), bytes.size()) < 0)
    throw Error("{}: cannot set up the in-memory file driver{}", where, hdf5_suffix());
  Id file(H5Fopen(memory_name().c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (!file.valid()) throw Error("{}: not a readable HDF5 file{}", where, hdf5_suffix());
  return file;
}

// Builds the whole golden file in memory: user block + HDF5 image.
std::string build_image(const std::string& path, const GoldenFile& g) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  if (!fapl.valid() || !fcpl.valid())
    throw Error("{}: cannot create property lists{}", path, hdf5_suffix());
  if (H5Pset_fapl_core(fapl, 1 << 20, /*backing_store=*/false) < 0)
    throw Error("{}: cannot set up the in-memory file driver{}", path, hdf5_suffix());
  H5Pset_obj_track_times(fcpl, false);  // best effort for the root group
  H5Eclear2(H5E_DEFAULT);
  if (H5Pset_userblock(fcpl, kUserBlockSize) < 0)
    throw Error("{}: cannot reserve the user block{}", path, hdf5_suffix());
  Id file(H5Fcreate(memory_name().c_str(), H5F_ACC_TRUNC, fcpl, fapl), H5Fclose);
  if (!file.valid()) throw Error("{}: cannot create the in-memory file{}", path, hdf5_suffix());
  Writer(path).write_all(file, g);
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0)
    throw Error("{}: cannot flush the in-memory file{}", path, hdf5_suffix());
  // The image starts at the HDF5 base address, after the user block.
  const ssize_t size = H5Fget_file_image(file, nullptr, 0);
  if (size <= 0) throw Error("{}: cannot get the in-memory file image{}", path, hdf5_suffix());
  std::string bytes(kUserBlockSize + static_cast<size_t>(size), '\0');
  if (H5Fget_file_image(file, bytes.data() + kUserBlockSize, static_cast<size_t>(size)) != size)
    throw Error("{}: cannot copy the in-memory file image{}", path, hdf5_suffix());
  if (file.close() < 0) throw Error("{}: cannot close the in-memory file{}", path, hdf5_suffix());
  return bytes;
}

}  // namespace

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

std::vector<std::string> remove_stale_golden_temps(const std::string& path) {
  return fileio::remove_stale_temps(path);
}

void write_golden_file(const std::string& path, const GoldenFile& g) {
  validate_golden(g, path);
  h5::silence_errors();
  std::string bytes;
  try {
    bytes = stamp_golden_header(build_image(path, g));
  } catch (const std::bad_alloc&) {
    throw Error("{}: out of memory while building the golden file", path);
  }
  fileio::write_atomic(path, bytes);
}

// ---------------------------------------------------------------------------
// Reading

namespace {

enum class Kind { u8, i32, f32, f64 };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::u8:
      return "uint8";
    case Kind::i32:
      return "int32";
    case Kind::f32:
      return "float32";
    case Kind::f64:
      return "float64";
  }
  return "?";
}

std::string describe_type(hid_t t) {
  const H5T_class_t cls = H5Tget_class(t);
  const size_t size = H5Tget_size(t);
  switch (cls) {
    case H5T_INTEGER:
      return fmt::format("{}int{}", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", size * 8);
    case H5T_FLOAT:
      return fmt::format("float{}", size * 8);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "vlen";
    default:
      return fmt::format("class {}", static_cast<int>(cls));
  }
}

bool type_matches(hid_t t, Kind k) {
  const H5T_class_t cls = H5Tget_class(t);
  const size_t size = H5Tget_size(t);
  switch (k) {
    case Kind::u8:
      return cls == H5T_INTEGER && size == 1 && H5Tget_sign(t) == H5T_SGN_NONE;
    case Kind::i32:
      return cls == H5T_INTEGER && size == 4 && H5Tget_sign(t) == H5T_SGN_2;
    case Kind::f32:
      return cls == H5T_FLOAT && size == 4;
    case Kind::f64:
      return cls == H5T_FLOAT && size == 8;
  }
  return false;
}

hid_t mem_type(Kind k) {
  switch (k) {
    case Kind::u8:
      return H5T_NATIVE_UCHAR;
    case Kind::i32:
      return H5T_NATIVE_INT32;
    case Kind::f32:
      return H5T_NATIVE_FLOAT;
    case Kind::f64:
      return H5T_NATIVE_DOUBLE;
  }
  return H5T_NATIVE_UCHAR;
}

std::string shape_str(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

constexpr int64_t kAny = -1;

std::string expected_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i)
    s += (i ? ", " : "") + (d[i] == kAny ? std::string("*") : std::to_string(d[i]));
  return s + "]";
}

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& obj, const std::string& what) const {
    throw Error("{}: {}: {}{}", file_, obj, what, hdf5_suffix());
  }

  bool exists(hid_t loc, const std::string& name) const {
    const htri_t r = H5Lexists(loc, name.c_str(), H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);
    return r > 0;
  }

  Id open_group(hid_t loc, const std::string& name, const std::string& obj) const {
    if (!exists(loc, name)) fail(obj, "missing group");
    Id g(H5Gopen2(loc, name.c_str(), H5P_DEFAULT), H5Gclose);
    if (!g.valid()) fail(obj, "cannot open group (not a group?)");
    return g;
  }

  Id open_attr(hid_t loc, const char* name, const std::string& aobj) const {
    const htri_t e = H5Aexists(loc, name);
    if (e < 0) fail(aobj, "cannot query attribute");
    if (e == 0) fail(aobj, "missing attribute");
    Id a(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
    if (!a.valid()) fail(aobj, "cannot open attribute");
    Id space(H5Aget_space(a), H5Sclose);
    if (!space.valid()) fail(aobj, "cannot get dataspace");
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    if (n != 1) fail(aobj, fmt::format("expected a single value, got {} elements", n));
    return a;
  }

  int64_t attr_int(hid_t loc, const char* name, const std::string& obj, int64_t lo,
                   int64_t hi) const {
    const std::string aobj = obj + "@" + name;
    Id a = open_attr(loc, name, aobj);
    Id t(H5Aget_type(a), H5Tclose);
    if (!t.valid()) fail(aobj, "cannot get datatype");
    if (H5Tget_class(t) != H5T_INTEGER)
      fail(aobj, "wrong dtype: expected an integer, got " + describe_type(t));
    int64_t v = 0;
    if (H5Aread(a, H5T_NATIVE_INT64, &v) < 0) fail(aobj, "cannot read attribute");
    if (v < lo || v > hi) fail(aobj, fmt::format("value {} out of range [{}, {}]", v, lo, hi));
    return v;
  }

  std::string attr_string(hid_t loc, const char* name, const std::string& obj) const {
    const std::string aobj = obj + "@" + name;
    Id a = open_attr(loc, name, aobj);
    Id t(H5Aget_type(a), H5Tclose);
    if (!t.valid()) fail(aobj, "cannot get datatype");
    if (H5Tget_class(t) != H5T_STRING)
      fail(aobj, "wrong dtype: expected a string, got " + describe_type(t));
    const htri_t vlen = H5Tis_variable_str(t);
    if (vlen < 0) fail(aobj, "cannot inspect string type");
    if (vlen > 0) {
      Id mt(H5Tcopy(H5T_C_S1), H5Tclose);
      if (!mt.valid() || H5Tset_size(mt, H5T_VARIABLE) < 0 || H5Tset_cset(mt, H5Tget_cset(t)) < 0)
        fail(aobj, "cannot create memory string type");
      char* p = nullptr;
      if (H5Aread(a, mt, &p) < 0) fail(aobj, "cannot read attribute");
      std::string s = p != nullptr ? std::string(p) : std::string();
      if (p != nullptr) H5free_memory(p);
      return s;
    }
    const size_t size = H5Tget_size(t);
    if (size == 0 || size > (1u << 20)) fail(aobj, fmt::format("bad string size {}", size));
    Id mt(H5Tcopy(t), H5Tclose);
    if (!mt.valid()) fail(aobj, "cannot copy string type");
    std::string buf(size, '\0');
    if (H5Aread(a, mt, buf.data()) < 0) fail(aobj, "cannot read attribute");
    if (H5Tget_strpad(t) == H5T_STR_SPACEPAD) {
      while (!buf.empty() && buf.back() == ' ') buf.pop_back();
    } else {
      buf.resize(std::strlen(buf.c_str()));
    }
    return buf;
  }

  // Opens `name`, checks dtype and shape (kAny = any extent), returns the
  // dataset with its dims.
  struct Opened {
    Id dset;
    std::vector<hsize_t> dims;
    uint64_t total = 0;
  };

  Opened open_dataset(hid_t loc, const char* name, const std::string& obj, Kind kind,
                      const std::vector<int64_t>& expected) const {
    const std::string dobj = obj + "/" + name;
    if (!exists(loc, name)) fail(dobj, "missing dataset");
    Opened o;
    o.dset = Id(H5Dopen2(loc, name, H5P_DEFAULT), H5Dclose);
    if (!o.dset.valid()) fail(dobj, "cannot open dataset (not a dataset?)");
    Id t(H5Dget_type(o.dset), H5Tclose);
    if (!t.valid()) fail(dobj, "cannot get datatype");
    if (!type_matches(t, kind))
      fail(dobj,
           fmt::format("wrong dtype: expected {}, got {}", kind_name(kind), describe_type(t)));
    Id space(H5Dget_space(o.dset), H5Sclose);
    if (!space.valid()) fail(dobj, "cannot get dataspace");
    const H5S_class_t sc = H5Sget_simple_extent_type(space);
    if (sc != H5S_SIMPLE)
      fail(dobj, fmt::format("expected shape {}, got a {} dataspace", expected_str(expected),
                             sc == H5S_SCALAR ? "scalar" : "null"));
    const int rank = H5Sget_simple_extent_ndims(space);
    if (rank < 0 || rank > 32) fail(dobj, "cannot get rank");
    o.dims.resize(static_cast<size_t>(rank));
    if (H5Sget_simple_extent_dims(space, o.dims.data(), nullptr) < 0) fail(dobj, "cannot get dims");
    bool ok = o.dims.size() == expected.size();
    for (size_t i = 0; ok && i < expected.size(); ++i)
      ok = expected[i] == kAny || static_cast<uint64_t>(expected[i]) == o.dims[i];
    if (!ok)
      fail(dobj,
           fmt::format("expected shape {}, got {}", expected_str(expected), shape_str(o.dims)));
    o.total = 1;
    for (hsize_t d : o.dims) {
      if (d != 0 && o.total > (uint64_t{1} << 40) / d) fail(dobj, "dataset is implausibly large");
      o.total *= d;
    }
    if (o.total * H5Tget_size(t) > (uint64_t{1} << 36)) fail(dobj, "dataset is implausibly large");
    return o;
  }

  template <typename T>
  std::vector<T> read(hid_t loc, const char* name, const std::string& obj, Kind kind,
                      const std::vector<int64_t>& expected) const {
    Opened o = open_dataset(loc, name, obj, kind, expected);
    std::vector<T> v(static_cast<size_t>(o.total));
    if (o.total > 0 && H5Dread(o.dset, mem_type(kind), H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
      fail(obj + "/" + name, "cannot read dataset");
    return v;
  }

  std::string read_bytes(hid_t loc, const char* name, const std::string& obj) const {
    auto v = read<unsigned char>(loc, name, obj, Kind::u8, {kAny});
    return std::string(v.begin(), v.end());
  }

  // Member names of a group, in creation order when tracked, else by name.
  std::vector<std::string> members(hid_t g, const std::string& obj) const {
    H5G_info_t info;
    if (H5Gget_info(g, &info) < 0) fail(obj, "cannot get group info");
    H5_index_t index = H5_INDEX_NAME;
    {
      Id gcpl(H5Gget_create_plist(g), H5Pclose);
      unsigned flags = 0;
      if (gcpl.valid() && H5Pget_link_creation_order(gcpl, &flags) >= 0 &&
          (flags & H5P_CRT_ORDER_TRACKED))
        index = H5_INDEX_CRT_ORDER;
      H5Eclear2(H5E_DEFAULT);
    }
    std::vector<std::string> names;
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      const ssize_t n = H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
      if (n < 0) fail(obj, fmt::format("cannot get name of member {}", i));
      std::string s(static_cast<size_t>(n) + 1, '\0');
      if (H5Lget_name_by_idx(g, ".", index, H5_ITER_INC, i, s.data(), s.size(), H5P_DEFAULT) < 0)
        fail(obj, fmt::format("cannot get name of member {}", i));
      s.resize(static_cast<size_t>(n));
      names.push_back(std::move(s));
    }
    return names;
  }

  GoldenCase read_case(hid_t cases, const std::string& name) const {
    const std::string obj = "/cases/" + name;
    Id g = open_group(cases, name, obj);
    GoldenCase c;
    c.name = attr_string(g, "name", obj);
    if (c.name != name)
      fail(obj + "@name", fmt::format("attribute name '{}' differs from the group name", c.name));
    c.chat = attr_int(g, "chat", obj, 0, 1) != 0;
    c.n_vocab = static_cast<int32_t>(attr_int(g, "n_vocab", obj, 1, INT32_MAX));
    c.top_k = static_cast<int32_t>(attr_int(g, "top_k", obj, 0, c.n_vocab));
    c.n_full_steps = static_cast<int32_t>(attr_int(g, "n_full_steps", obj, 0, INT32_MAX));
    c.prompt_text = read_bytes(g, "prompt_text", obj);
    c.prompt_ids = read<int32_t>(g, "prompt_ids", obj, Kind::i32, {kAny});
    c.greedy_ids = read<int32_t>(g, "greedy_ids", obj, Kind::i32, {kAny});
    const auto G = static_cast<int64_t>(c.greedy_ids.size());
    if (c.n_full_steps > G)
      fail(obj + "@n_full_steps",
           fmt::format("n_full_steps = {} exceeds G = {} (size of greedy_ids)", c.n_full_steps, G));
    c.greedy_text = read_bytes(g, "greedy_text", obj);
    c.full_logits = read<float>(g, "full_logits", obj, Kind::f32, {c.n_full_steps, c.n_vocab});
    c.topk_ids = read<int32_t>(g, "topk_ids", obj, Kind::i32, {G, c.top_k});
    c.topk_logits = read<float>(g, "topk_logits", obj, Kind::f32, {G, c.top_k});
    c.lse = read<double>(g, "lse", obj, Kind::f64, {G});
    return c;
  }

  GoldenScoring read_scoring(hid_t scoring, const std::string& name) const {
    const std::string obj = "/scoring/" + name;
    Id g = open_group(scoring, name, obj);
    GoldenScoring s;
    s.name = attr_string(g, "name", obj);
    if (s.name != name)
      fail(obj + "@name", fmt::format("attribute name '{}' differs from the group name", s.name));
    s.n_vocab = static_cast<int32_t>(attr_int(g, "n_vocab", obj, 1, INT32_MAX));
    s.top_k = static_cast<int32_t>(attr_int(g, "top_k", obj, 0, s.n_vocab));
    s.text = read_bytes(g, "text", obj);
    s.token_ids = read<int32_t>(g, "token_ids", obj, Kind::i32, {kAny});
    const auto N = static_cast<int64_t>(s.token_ids.size());
    const int64_t R = N > 0 ? N - 1 : 0;
    s.topk_ids = read<int32_t>(g, "topk_ids", obj, Kind::i32, {R, s.top_k});
    s.topk_logits = read<float>(g, "topk_logits", obj, Kind::f32, {R, s.top_k});
    s.lse = read<double>(g, "lse", obj, Kind::f64, {R});
    s.target_logits = read<float>(g, "target_logits", obj, Kind::f32, {R});
    return s;
  }

  GoldenFile read_all(hid_t file) const {
    GoldenFile g;
    g.format_version =
        static_cast<int>(attr_int(file, "format_version", "/", INT32_MIN, INT32_MAX));
    if (g.format_version != kGoldenFormatVersion)
      fail("/@format_version", fmt::format("unsupported format_version {} (this build reads {})",
                                           g.format_version, kGoldenFormatVersion));
    g.model_name = attr_string(file, "model_name", "/");
    g.model_sha256 = attr_string(file, "model_sha256", "/");
    g.reference_version = attr_string(file, "reference_version", "/");
    g.reference_revision = attr_string(file, "reference_revision", "/");
    Id cases = open_group(file, "cases", "/cases");
    for (const auto& n : members(cases, "/cases")) g.cases.push_back(read_case(cases, n));
    Id scoring = open_group(file, "scoring", "/scoring");
    for (const auto& n : members(scoring, "/scoring"))
      g.scoring.push_back(read_scoring(scoring, n));
    return g;
  }

 private:
  std::string file_;
};

}  // namespace

GoldenFile parse_golden_bytes(const std::string& where, const std::string& bytes, bool trust) {
  h5::silence_errors();
  try {
    verify_header(where, bytes, trust);
    Id file = open_image(where, bytes);
    GoldenFile g = Reader(where).read_all(file);
    validate_golden(g, where);
    return g;
  } catch (const std::bad_alloc&) {
    throw Error("{}: out of memory while reading (malformed sizes?)", where);
  }
}

GoldenFile read_golden_file(const std::string& path, bool trust) {
  return parse_golden_bytes(path, fileio::read_file(path, "golden file"), trust);
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
