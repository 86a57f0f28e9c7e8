// touchstone/model/gguf.h - a bounds-checked, read-only GGUF (v2/v3) reader.
//
// Format reference: ggml/docs/gguf.md (the GGUF spec). Layout of a file:
//
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv      x { string key | u32 value_type | value }
//   n_tensors x { string name | u32 n_dims | u64 dims[n_dims] | u32 type | u64 offset }
//   padding to general.alignment (default 32)
//   data section (tensor offsets are relative to its start and aligned)
//
// Strings are u64 length + UTF-8 bytes (no terminator); arrays are u32
// element type + u64 count + elements. Everything is little-endian.
//
// The whole file is read into private, read-only memory at open (not
// mmap()ed: a mapped file truncated by another process raises SIGBUS on the
// next access; see File::open in gguf.cpp). Every read is checked against the file
// size and every count is capped by the bytes that remain, so malformed input
// raises touchstone::Error (naming the file, the byte offset and the field)
// instead of crashing or allocating without bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace touchstone::gguf {

/// Metadata value types (gguf_metadata_value_type in the spec).
enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

/// Tensor element types, numbered as ggml_type (ggml.h). Gaps (4, 5, 31-33,
/// 36-38) are types removed from ggml; they are reported as unknown.
enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
};

/// "UINT32", "STRING", ... or "type#N" for an unknown value.
std::string_view value_type_name(ValueType t);

/// One metadata value. Scalars are widened: unsigned integers live in
/// uint64_t, signed ones in int64_t, FLOAT32/FLOAT64 in double; `type` keeps
/// the type as stored. Arrays hold their elements as Values of `array_type`.
struct Value {
  ValueType type = ValueType::UINT8;
  ValueType array_type = ValueType::UINT8;  // meaningful when type == ARRAY
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<Value>> v;

  bool is_integer() const;  // any of the eight integer types
  bool is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }
  /// Human-readable type, e.g. "UINT32" or "ARRAY[STRING]".
  std::string type_string() const;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // ggml order: shape[0] is the fastest-varying (row length)
  TensorType type = TensorType::F32;
  uint64_t offset = 0;  // relative to the start of the data section, as stored
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;      // 0 when the type is unknown (size cannot be computed)
  uint64_t info_offset = 0;  // byte offset of this tensor's info record (for messages)
};

/// An open GGUF file. Move-only; owns a read-only in-memory copy of the whole file.
class File {
 public:
  /// Opens and validates `path`. Throws touchstone::Error on any problem.
  static File open(const std::string& path);
  /// The same checks and the same metadata and tensor infos, from the file's header only
  /// (read in prefixes until it parses; the tensor data is never read into memory, but
  /// every tensor's range is still checked against the file's size): for readers of the
  /// metadata (config, tokenizer, chat template) of a model too big to copy twice.
  /// tensor_data() then throws touchstone::Error.
  static File open_metadata(const std::string& path);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return size_; }

  // ---- metadata -----------------------------------------------------------
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  bool has(std::string_view key) const;
  /// Throws Error naming file + key if absent.
  const Value& get(std::string_view key) const;

  // Typed getters: throw Error naming file + key + actual type when the key is
  // missing or of the wrong type. Integer getters accept any integer type
  // whose value fits; float getters accept FLOAT32/FLOAT64.
  uint64_t get_uint(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::string get_string(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;

  // nullopt when absent; still throw on a wrong type.
  std::optional<uint64_t> find_uint(std::string_view key) const;
  std::optional<int64_t> find_int(std::string_view key) const;
  std::optional<double> find_float(std::string_view key) const;
  std::optional<bool> find_bool(std::string_view key) const;
  std::optional<std::string> find_string(std::string_view key) const;

  // ---- tensors ------------------------------------------------------------
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent
  const TensorInfo& tensor(std::string_view name) const;       // throws Error naming file + tensor
  /// The raw bytes of a tensor. Throws for unknown types or out-of-range data.
  std::span<const uint8_t> tensor_data(const TensorInfo& t) const;

  /// Frees the file's bytes, keeping its metadata and tensor infos (as open_metadata()
  /// would have): for a reader that has copied what it needs. tensor_data() then throws.
  void release_data() noexcept;
  /// Gives back to the kernel the whole pages of the file's bytes inside `bytes` (a range
  /// of this file's data, e.g. a tensor_data() span a reader has copied), so that a
  /// reader copying the model elsewhere holds about one copy at any time, not two.
  /// Those bytes then read as zeros until release_data(): the caller must not read them
  /// again. Ignored for a range outside the file's bytes.
  void discard_pages(std::span<const uint8_t> bytes) noexcept;
  /// True after open_metadata() or release_data().
  bool metadata_only() const { return metadata_only_; }

  uint64_t data_offset() const { return data_offset_; }
  uint64_t alignment() const { return alignment_; }

 private:
  File() = default;
  void release() noexcept;
  const Value* lookup(std::string_view key, uint64_t* offset) const;
  [[noreturn]] void wrong_type(std::string_view key, const Value& val,
                               std::string_view wanted) const;

  friend class FileParser;

  std::string path_;
  const uint8_t* base_ = nullptr;  // the file's bytes (anonymous mapping), nullptr when empty
  uint64_t size_ = 0;
  bool metadata_only_ = false;  // open_metadata(): no bytes kept, tensor_data() refuses
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<uint64_t> metadata_offsets_;  // byte offset of each key/value record
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace touchstone::gguf
