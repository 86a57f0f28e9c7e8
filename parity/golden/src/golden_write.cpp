// Writing golden files: built in memory (HDF5 core driver), stamped with the
// checksum header, written crash-safely. Layout: docs/golden-format.md.
#include <fmt/format.h>

#include <algorithm>
#include <new>

#include "golden_checksum.h"
#include "h5util.h"
#include "touchstone/common/error.h"
#include "touchstone/golden/file_io.h"
#include "touchstone/golden/golden.h"

namespace touchstone {

using detail::kUserBlockSize;
using h5::Id;

namespace {

class Writer {
 public:
  explicit Writer(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& obj, const std::string& what) const {
    throw Error("{}: {}: {}{}", file_, obj, what, h5::error_suffix());
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
  void words(hid_t loc, const char* name, const std::vector<uint32_t>& v, std::vector<hsize_t> dims,
             const std::string& obj) const {
    dataset(loc, name, v.data(), std::move(dims), H5T_STD_U32LE, H5T_NATIVE_UINT32, obj, true);
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
      if (!c.tap_steps.empty()) {
        const hsize_t T = c.tap_steps.size();
        ints(grp, "tap_steps", c.tap_steps, {T}, obj);
        floats(grp, "taps", c.taps,
               {T, hsize_t(c.tap_layers), hsize_t(kTapPoints), hsize_t(c.tap_dim)}, obj, true);
      }
      if (c.has_grammar()) {
        attr_string(grp, "grammar_kind", c.grammar_kind, obj);
        bytes(grp, "grammar_text", c.grammar_text, obj);
        words(grp, "allowed_masks", c.allowed_masks, {G, hsize_t(c.mask_words())}, obj);
      }
      if (c.has_image()) {
        attr_int(grp, "image_at", c.image_at, H5T_STD_I32LE, obj);
        if (c.image_frames.size() > 1)
          ints(grp, "image_frames", c.image_frames, {c.image_frames.size()}, obj);
        attr_int(grp, "image_bidirectional", c.image_bidirectional, H5T_STD_I8LE, obj);
        attr_string(grp, "image_sha256", c.image_sha256, obj);
        attr_string(grp, "pixels_sha256", c.pixels_sha256, obj);
        attr_string(grp, "mmproj_sha256", c.mmproj_sha256, obj);
        floats(grp, "image_embeddings", c.image_embeddings,
               {hsize_t(c.image_tokens), hsize_t(c.image_dim)}, obj);
      }
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

// Builds the whole golden file in memory: user block + HDF5 image.
std::string build_image(const std::string& path, const GoldenFile& g) {
  Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  Id fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  if (!fapl.valid() || !fcpl.valid())
    throw Error("{}: cannot create property lists{}", path, h5::error_suffix());
  if (H5Pset_fapl_core(fapl, 1 << 20, /*backing_store=*/false) < 0)
    throw Error("{}: cannot set up the in-memory file driver{}", path, h5::error_suffix());
  H5Pset_obj_track_times(fcpl, false);  // best effort for the root group
  H5Eclear2(H5E_DEFAULT);
  if (H5Pset_userblock(fcpl, kUserBlockSize) < 0)
    throw Error("{}: cannot reserve the user block{}", path, h5::error_suffix());
  Id file(H5Fcreate(h5::memory_name().c_str(), H5F_ACC_TRUNC, fcpl, fapl), H5Fclose);
  if (!file.valid())
    throw Error("{}: cannot create the in-memory file{}", path, h5::error_suffix());
  Writer(path).write_all(file, g);
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0)
    throw Error("{}: cannot flush the in-memory file{}", path, h5::error_suffix());
  // The image starts at the HDF5 base address, after the user block.
  const ssize_t size = H5Fget_file_image(file, nullptr, 0);
  if (size <= 0) throw Error("{}: cannot get the in-memory file image{}", path, h5::error_suffix());
  std::string bytes(kUserBlockSize + static_cast<size_t>(size), '\0');
  if (H5Fget_file_image(file, bytes.data() + kUserBlockSize, static_cast<size_t>(size)) != size)
    throw Error("{}: cannot copy the in-memory file image{}", path, h5::error_suffix());
  if (file.close() < 0)
    throw Error("{}: cannot close the in-memory file{}", path, h5::error_suffix());
  return bytes;
}

}  // namespace

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

}  // namespace touchstone
