// Reading golden files: checksum header first, then libhdf5 on the verified
// bytes in memory. Layout: docs/golden-format.md.
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "golden_checksum.h"
#include "h5util.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/golden/golden.h"

namespace touchstone {

using h5::Id;

namespace {

// Opens an HDF5 image held in memory (core driver, no backing store).
Id open_image(const std::string& where, const std::string& bytes) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (!fapl.valid())
    throw Error("{}: cannot create file access property list{}", where, h5::error_suffix());
  if (H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0 ||
      H5Pset_fapl_core(fapl, 1 << 20, /*backing_store=*/false) < 0 ||
      H5Pset_file_image(fapl, const_cast<char*>(bytes.data()), bytes.size()) < 0)
    throw Error("{}: cannot set up the in-memory file driver{}", where, h5::error_suffix());
  Id file(H5Fopen(h5::memory_name().c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
  if (!file.valid()) throw Error("{}: not a readable HDF5 file{}", where, h5::error_suffix());
  return file;
}

enum class Kind { u8, i32, u32, f32, f64 };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::u8:
      return "uint8";
    case Kind::i32:
      return "int32";
    case Kind::u32:
      return "uint32";
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
    case Kind::u32:
      return cls == H5T_INTEGER && size == 4 && H5Tget_sign(t) == H5T_SGN_NONE;
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
    case Kind::u32:
      return H5T_NATIVE_UINT32;
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
    throw Error("{}: {}: {}{}", file_, obj, what, h5::error_suffix());
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

  // Layer taps [T, layers, kTapPoints, dim] and tap_steps [T] (format 2).
  void read_taps(hid_t g, const std::string& obj, GoldenCase& c) const {
    c.tap_steps = read<int32_t>(g, "tap_steps", obj, Kind::i32, {kAny});
    const auto T = static_cast<int64_t>(c.tap_steps.size());
    Opened o = open_dataset(g, "taps", obj, Kind::f32, {T, kAny, kTapPoints, kAny});
    if (o.dims[1] < 1 || o.dims[1] > 4096 || o.dims[3] < 1 || o.dims[3] > (1u << 20))
      fail(obj + "/taps", fmt::format("implausible shape {}", shape_str(o.dims)));
    c.tap_layers = static_cast<int32_t>(o.dims[1]);
    c.tap_dim = static_cast<int32_t>(o.dims[3]);
    c.taps.resize(static_cast<size_t>(o.total));
    if (o.total > 0 &&
        H5Dread(o.dset, mem_type(Kind::f32), H5S_ALL, H5S_ALL, H5P_DEFAULT, c.taps.data()) < 0)
      fail(obj + "/taps", "cannot read dataset");
  }

  // Structured output (optional): the grammar and the allowed set of every step.
  void read_grammar(hid_t g, const std::string& obj, GoldenCase& c) const {
    c.grammar_kind = attr_string(g, "grammar_kind", obj);
    if (c.grammar_kind != "json_schema" && c.grammar_kind != "gbnf" && c.grammar_kind != "regex")
      fail(obj + "@grammar_kind", fmt::format("unknown grammar kind '{}'", c.grammar_kind));
    c.grammar_text = read_bytes(g, "grammar_text", obj);
    const auto G = static_cast<int64_t>(c.greedy_ids.size());
    c.allowed_masks =
        read<uint32_t>(g, "allowed_masks", obj, Kind::u32, {G, int64_t(c.mask_words())});
  }

  // Image input (format 3, optional): where it goes and the embeddings the decoder takes.
  void read_image(hid_t g, const std::string& obj, GoldenCase& c, int version) const {
    const auto P = static_cast<int64_t>(c.prompt_ids.size());
    c.image_at = static_cast<int32_t>(attr_int(g, "image_at", obj, 1, std::max<int64_t>(1, P - 1)));
    c.image_bidirectional = static_cast<int32_t>(attr_int(g, "image_bidirectional", obj, 0, 1));
    if (version >= 4 && exists(g, "image_frames"))
      c.image_frames = read<int32_t>(g, "image_frames", obj, Kind::i32, {kAny});
    c.image_sha256 = attr_string(g, "image_sha256", obj);
    c.pixels_sha256 = attr_string(g, "pixels_sha256", obj);
    c.mmproj_sha256 = attr_string(g, "mmproj_sha256", obj);
    Opened o = open_dataset(g, "image_embeddings", obj, Kind::f32, {kAny, kAny});
    if (o.dims[0] < 1 || o.dims[0] > (1u << 16) || o.dims[1] < 1 || o.dims[1] > (1u << 20))
      fail(obj + "/image_embeddings", fmt::format("implausible shape {}", shape_str(o.dims)));
    c.image_tokens = static_cast<int32_t>(o.dims[0]);
    c.image_dim = static_cast<int32_t>(o.dims[1]);
    c.image_embeddings.resize(static_cast<size_t>(o.total));
    if (H5Dread(o.dset, mem_type(Kind::f32), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                c.image_embeddings.data()) < 0)
      fail(obj + "/image_embeddings", "cannot read dataset");
  }

  GoldenCase read_case(hid_t cases, const std::string& name, int version) const {
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
    if (version >= 2 && exists(g, "taps")) read_taps(g, obj, c);
    if (exists(g, "grammar_text")) read_grammar(g, obj, c);
    if (version >= 3 && exists(g, "image_embeddings")) read_image(g, obj, c, version);
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
    if (g.format_version < kGoldenOldestFormatVersion || g.format_version > kGoldenFormatVersion)
      fail("/@format_version",
           fmt::format("unsupported format_version {} (this build reads {}..{})", g.format_version,
                       kGoldenOldestFormatVersion, kGoldenFormatVersion));
    g.model_name = attr_string(file, "model_name", "/");
    g.model_sha256 = attr_string(file, "model_sha256", "/");
    g.reference_version = attr_string(file, "reference_version", "/");
    g.reference_revision = attr_string(file, "reference_revision", "/");
    Id cases = open_group(file, "cases", "/cases");
    for (const auto& n : members(cases, "/cases"))
      g.cases.push_back(read_case(cases, n, g.format_version));
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
    detail::verify_header(where, bytes, trust);
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

}  // namespace touchstone
