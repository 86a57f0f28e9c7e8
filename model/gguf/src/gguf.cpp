// gguf.cpp - GGUF v2/v3 parser (see ggml/docs/gguf.md) and File accessors.
//
// Robustness rules applied throughout:
//  * every read goes through FileParser::need(), checked against the file size;
//  * string lengths and array/record counts are capped by the remaining
//    bytes (divided by the smallest possible encoded element), so a corrupt
//    count can never trigger an allocation larger than the file justifies;
//  * nested arrays are limited in depth and the total number of metadata
//    values is capped;
//  * tensor shapes/sizes are overflow-checked and tensor data must lie inside
//    the file, aligned to general.alignment.
// Every error names the file, the byte offset of the offending field and the
// field itself.
#include "touchstone/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "touchstone/common/error.h"
#include "touchstone/model/quant.h"

namespace touchstone::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;     // "GGUF" read as little-endian u32
constexpr uint64_t kDefaultAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT
constexpr uint32_t kMaxDims = 4;            // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 4;           // nested arrays (rare; llama.cpp rejects them)
constexpr uint64_t kMaxMetadataValues = 1ull
                                        << 23;  // all array elements together (~400 MB of Values)
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;     // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims=0, type, offset

constexpr const char* kValueTypeNames[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                           "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                           "UINT64", "INT64",   "FLOAT64"};

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::FLOAT64); }

/// Smallest number of bytes one encoded value of type `t` can occupy.
uint64_t min_encoded_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    case ValueType::STRING:
      return 8;  // u64 length
    case ValueType::ARRAY:
      return 4 + 8;  // u32 type + u64 count
  }
  return 1;
}

}  // namespace

std::string_view value_type_name(ValueType t) {
  const auto i = static_cast<uint32_t>(t);
  if (valid_value_type(i)) return kValueTypeNames[i];
  thread_local std::string unknown;
  unknown = fmt::format("type#{}", i);
  return unknown;
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::UINT16:
    case ValueType::INT16:
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::UINT64:
    case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

std::string Value::type_string() const {
  if (type == ValueType::ARRAY) return fmt::format("ARRAY[{}]", value_type_name(array_type));
  return std::string(value_type_name(type));
}

// ---------------------------------------------------------------------------
// FileParser: a cursor over the file's bytes that fills a File.
// ---------------------------------------------------------------------------
// Thrown by a metadata-only parse whose buffer ends before the header does.
struct NeedMoreBytes {};

class FileParser {
 public:
  // avail: how many of the file's bytes are in the buffer (the whole file, or the first
  // ones for File::open_metadata: a read past them throws NeedMoreBytes).
  explicit FileParser(File& f, uint64_t avail)
      : f_(f), base_(f.base_), size_(f.size_), avail_(avail) {}
  explicit FileParser(File& f) : FileParser(f, f.size_) {}

  void parse() {
    parse_header();
    for (uint64_t i = 0; i < n_kv_; ++i) parse_kv(i);
    apply_alignment();
    for (uint64_t i = 0; i < n_tensors_; ++i) parse_tensor_info(i);
    where_ = "data section";
    f_.data_offset_ = align_up(pos_, f_.alignment_, pos_);
    for (const TensorInfo& t : f_.tensors_) check_tensor_data(t);
  }

 private:
  // ---- error reporting ----
  template <typename... Args>
  [[noreturn]] void fail_at(uint64_t at, fmt::format_string<Args...> fmtstr, Args&&... args) const {
    std::string msg = fmt::format(fmtstr, std::forward<Args>(args)...);
    std::string elems;
    for (uint64_t e : elem_path_) elems += fmt::format(" element #{}", e);
    throw Error("{}: offset {}: {}{}: {}", f_.path_, at, where_, elems, msg);
  }

  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, std::string_view field) const {
    if (n > remaining())
      fail_at(pos_, "{}: needs {} bytes but only {} remain (file size {})", field, n, remaining(),
              size_);
    if (pos_ + n > avail_) throw NeedMoreBytes{};
  }

  template <typename T>
  T read(std::string_view field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view field) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>(field);
    if (len > remaining())
      fail_at(at, "{}: string length {} exceeds remaining {} bytes", field, len, remaining());
    if (pos_ + len > avail_) throw NeedMoreBytes{};
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  uint64_t align_up(uint64_t x, uint64_t a, uint64_t at) const {
    const uint64_t r = x % a;
    if (r == 0) return x;
    if (x > std::numeric_limits<uint64_t>::max() - (a - r))
      fail_at(at, "offset {} overflows when aligned to {}", x, a);
    return x + (a - r);
  }

  // ---- header ----
  void parse_header() {
    where_ = "header";
    if (size_ < 4) fail_at(0, "magic: file is only {} bytes, not a GGUF file", size_);
    const auto magic = read<uint32_t>("magic");
    if (magic != kMagic) {
      fail_at(0, "magic: bad magic 0x{:08x} (bytes '{}'), expected 'GGUF'", magic,
              printable(std::string_view(reinterpret_cast<const char*>(base_), 4)));
    }
    const uint64_t at = pos_;
    const auto version = read<uint32_t>("version");
    if (version == 1)
      fail_at(at, "version: GGUF version 1 is not supported (only versions 2 and 3)");
    if ((version & 0xFFFF) == 0 && version != 0)
      fail_at(at, "version: 0x{:08x} looks like a big-endian GGUF file, which is not supported",
              version);
    if (version != 2 && version != 3)
      fail_at(at, "version: unsupported GGUF version {} (expected 2 or 3)", version);
    f_.version_ = version;

    const uint64_t at_nt = pos_;
    n_tensors_ = read<uint64_t>("tensor count");
    const uint64_t at_nkv = pos_;
    n_kv_ = read<uint64_t>("metadata key/value count");
    if (n_kv_ > remaining() / kMinKvBytes)
      fail_at(at_nkv, "metadata key/value count {} exceeds what the remaining {} bytes can hold",
              n_kv_, remaining());
    if (n_tensors_ > remaining() / kMinTensorInfoBytes ||
        n_kv_ * kMinKvBytes + n_tensors_ * kMinTensorInfoBytes > remaining())
      fail_at(at_nt, "tensor count {} exceeds what the remaining {} bytes can hold", n_tensors_,
              remaining());
    f_.metadata_.reserve(static_cast<size_t>(n_kv_));
    f_.metadata_offsets_.reserve(static_cast<size_t>(n_kv_));
    f_.tensors_.reserve(static_cast<size_t>(n_tensors_));
  }

  static std::string printable(std::string_view s) {
    std::string out;
    for (char c : s) {
      if (c >= 0x20 && c < 0x7F)
        out += c;
      else
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    }
    return out;
  }

  // ---- metadata ----
  void parse_kv(uint64_t index) {
    const uint64_t at = pos_;
    where_ = fmt::format("metadata key #{}", index);
    std::string key = read_string("key");
    where_ = fmt::format("metadata key #{} '{}'", index, printable(key));
    if (f_.metadata_index_.count(key) != 0) fail_at(at, "duplicate metadata key");
    const uint64_t at_type = pos_;
    const auto type = read<uint32_t>("value type");
    if (!valid_value_type(type)) fail_at(at_type, "value type: invalid value type {}", type);
    Value v = read_value(static_cast<ValueType>(type), 0);
    f_.metadata_index_.emplace(key, f_.metadata_.size());
    f_.metadata_.emplace_back(std::move(key), std::move(v));
    f_.metadata_offsets_.push_back(at);
  }

  Value read_value(ValueType type, int depth) {
    Value val;
    val.type = type;
    switch (type) {
      case ValueType::UINT8:
        val.v = uint64_t{read<uint8_t>("UINT8 value")};
        break;
      case ValueType::INT8:
        val.v = int64_t{read<int8_t>("INT8 value")};
        break;
      case ValueType::UINT16:
        val.v = uint64_t{read<uint16_t>("UINT16 value")};
        break;
      case ValueType::INT16:
        val.v = int64_t{read<int16_t>("INT16 value")};
        break;
      case ValueType::UINT32:
        val.v = uint64_t{read<uint32_t>("UINT32 value")};
        break;
      case ValueType::INT32:
        val.v = int64_t{read<int32_t>("INT32 value")};
        break;
      case ValueType::UINT64:
        val.v = read<uint64_t>("UINT64 value");
        break;
      case ValueType::INT64:
        val.v = read<int64_t>("INT64 value");
        break;
      case ValueType::FLOAT32:
        val.v = double{read<float>("FLOAT32 value")};
        break;
      case ValueType::FLOAT64:
        val.v = read<double>("FLOAT64 value");
        break;
      case ValueType::BOOL: {
        const uint64_t at = pos_;
        const auto b = read<uint8_t>("BOOL value");
        if (b > 1) fail_at(at, "BOOL value: invalid byte {} (must be 0 or 1)", b);
        val.v = (b == 1);
        break;
      }
      case ValueType::STRING:
        val.v = read_string("string");
        break;
      case ValueType::ARRAY:
        read_array(val, depth);
        break;
    }
    return val;
  }

  void read_array(Value& val, int depth) {
    const uint64_t at_type = pos_;
    if (depth >= kMaxArrayDepth)
      fail_at(at_type, "array: nested deeper than {} levels", kMaxArrayDepth);
    const auto etype = read<uint32_t>("array element type");
    if (!valid_value_type(etype))
      fail_at(at_type, "array element type: invalid value type {}", etype);
    val.array_type = static_cast<ValueType>(etype);
    const uint64_t at_count = pos_;
    const auto count = read<uint64_t>("array count");
    const uint64_t min_size = min_encoded_size(val.array_type);
    if (count > remaining() / min_size)
      fail_at(at_count, "array count {} of {} exceeds remaining {} bytes", count,
              value_type_name(val.array_type), remaining());
    n_values_ += count;
    if (n_values_ > kMaxMetadataValues)
      fail_at(at_count, "array count {}: more than {} metadata values in total", count,
              kMaxMetadataValues);
    std::vector<Value> elems;
    elems.reserve(static_cast<size_t>(count));
    elem_path_.push_back(0);
    for (uint64_t i = 0; i < count; ++i) {
      elem_path_.back() = i;
      elems.push_back(read_value(val.array_type, depth + 1));
    }
    elem_path_.pop_back();
    val.v = std::move(elems);
  }

  void apply_alignment() {
    const auto it = f_.metadata_index_.find(std::string_view("general.alignment"));
    if (it == f_.metadata_index_.end()) return;
    const Value& v = f_.metadata_[it->second].second;
    const uint64_t at = f_.metadata_offsets_[it->second];
    where_ = "metadata key 'general.alignment'";
    const uint64_t* a = std::get_if<uint64_t>(&v.v);
    if (!v.is_integer() || a == nullptr)
      fail_at(at, "expected an unsigned integer (UINT32), found {}", v.type_string());
    if (*a == 0 || (*a & (*a - 1)) != 0 || *a > (1u << 30))
      fail_at(at, "alignment {} is not a power of two in [1, 2^30]", *a);
    f_.alignment_ = *a;
  }

  // ---- tensor infos ----
  void parse_tensor_info(uint64_t index) {
    TensorInfo t;
    t.info_offset = pos_;
    where_ = fmt::format("tensor #{}", index);
    t.name = read_string("name");
    where_ = fmt::format("tensor #{} '{}'", index, printable(t.name));
    if (f_.tensor_index_.count(t.name) != 0) fail_at(t.info_offset, "duplicate tensor name");

    const uint64_t at_dims = pos_;
    const auto n_dims = read<uint32_t>("n_dims");
    if (n_dims > kMaxDims)
      fail_at(at_dims, "n_dims {} exceeds the maximum of {}", n_dims, kMaxDims);
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t at = pos_;
      const auto dim = read<uint64_t>("dimension");
      if (dim == 0) fail_at(at, "dimension {} is zero", d);
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / t.n_elements)
        fail_at(at, "dimension {} = {}: element count overflows int64", d, dim);
      t.shape.push_back(dim);
      t.n_elements *= dim;
    }

    const uint64_t at_type = pos_;
    t.type = static_cast<TensorType>(read<uint32_t>("type"));
    if (const TypeTraits* tt = find_type_traits(t.type)) {
      const uint64_t row = t.shape.empty() ? 1 : t.shape[0];
      if (row % tt->block_size != 0 || t.n_elements % tt->block_size != 0)
        fail_at(at_type,
                "type {}: row length {} (n_elements {}) is not a multiple of the block size {}",
                tt->name, row, t.n_elements, tt->block_size);
      const uint64_t n_blocks = t.n_elements / tt->block_size;
      if (n_blocks > std::numeric_limits<uint64_t>::max() / tt->type_size)
        fail_at(at_type, "type {}: byte size overflows", tt->name);
      t.n_bytes = n_blocks * tt->type_size;
    }  // unknown types are listed with n_bytes = 0; tensor_data() refuses them

    const uint64_t at_off = pos_;
    t.offset = read<uint64_t>("data offset");
    if (t.offset % f_.alignment_ != 0)
      fail_at(at_off, "data offset {} is not a multiple of the alignment {}", t.offset,
              f_.alignment_);

    f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    f_.tensors_.push_back(std::move(t));
  }

  void check_tensor_data(const TensorInfo& t) const {
    const uint64_t data_size = f_.data_offset_ <= size_ ? size_ - f_.data_offset_ : 0;
    if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
      throw Error(
          "{}: offset {}: tensor '{}': data [{}, +{}) lies outside the data section "
          "(starts at file offset {}, {} bytes long, file size {})",
          f_.path_, t.info_offset, printable(t.name), t.offset, t.n_bytes, f_.data_offset_,
          data_size, size_);
    }
  }

  File& f_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t avail_;
  uint64_t pos_ = 0;
  uint64_t n_kv_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_values_ = 0;
  std::string where_;
  std::vector<uint64_t> elem_path_;
};

// ---------------------------------------------------------------------------
// File: buffer lifetime
// ---------------------------------------------------------------------------
namespace {

// The fd of `path`, a regular file, and its size. Throws Error naming the file.
int open_regular(const std::string& path, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw Error("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("{}: not a regular file", path);
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// Reads the first len bytes of fd into dst. Throws Error (fd left open) on a read error
// or when the file ends before them.
void read_prefix(int fd, const std::string& path, uint8_t* dst, size_t len, uint64_t size) {
  size_t done = 0;
  while (done < len) {
    const size_t chunk = std::min<size_t>(len - done, size_t{1} << 30);
    const ssize_t n = ::pread(fd, dst + done, chunk, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("{}: offset {}: read error: {}", path, done, std::strerror(errno));
    if (n == 0) {
      throw Error("{}: offset {}: file shrank while being read (it was {} bytes when opened)", path,
                  done, size);
    }
    done += static_cast<size_t>(n);
  }
}

struct FdCloser {
  int fd;
  ~FdCloser() { ::close(fd); }
};

}  // namespace

File File::open(const std::string& path) {
  File f;
  f.path_ = path;
  const FdCloser fd{open_regular(path, &f.size_)};
  // The file is READ into private memory, not mmap()ed. With a file mapping, a
  // file truncated by someone else while it is open (a download being
  // replaced, `cp` over the model, a full disk) turns every later access to
  // the lost pages into SIGBUS, anywhere in the program (the tensor spans
  // handed out by tensor_data() are read by backends long after open()). A
  // SIGBUS handler cannot make those accesses safe, and re-checking the size
  // before each access leaves a race. Reading costs one copy at open (~0.1 s
  // for a 100 MB model from the page cache) and private memory equal to the
  // file size; in exchange a file that shrinks while being read is an
  // ordinary Error and nothing done to the file afterwards can reach us.
  // The buffer is an anonymous mapping (page-aligned, as the file mapping
  // was, so tensor data stays aligned to general.alignment) made read-only
  // once filled.
  if (f.size_ > 0) {
    const auto len = static_cast<size_t>(f.size_);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw Error("{}: cannot allocate {} bytes to read the file: {}", path, f.size_,
                  std::strerror(errno));
    }
    f.base_ = static_cast<const uint8_t*>(p);  // owned from here: ~File unmaps on throw
    read_prefix(fd.fd, path, static_cast<uint8_t*>(p), len, f.size_);
    ::mprotect(p, len, PROT_READ);  // best effort: a stray write then faults
  }
  FileParser(f).parse();  // on throw, ~File frees the buffer
  return f;
}

File File::open_metadata(const std::string& path) {
  uint64_t size = 0;
  const FdCloser fd{open_regular(path, &size)};
  // The header is read in growing prefixes (1 MiB, then x4) until it parses: a model's
  // metadata is mostly its vocabulary (SmolLM2: 2.2 MB, a 128k vocabulary: ~8 MB).
  for (uint64_t want = std::min<uint64_t>(size, uint64_t{1} << 20);;
       want = std::min(size, want * 4)) {
    std::vector<uint8_t> buf(static_cast<size_t>(want));
    read_prefix(fd.fd, path, buf.data(), buf.size(), size);
    File f;
    f.path_ = path;
    f.size_ = size;
    f.base_ = buf.data();
    struct Detach {  // the buffer is buf's, never ~File's to unmap
      File& f;
      ~Detach() { f.base_ = nullptr; }
    } detach{f};
    try {
      FileParser(f, want).parse();
    } catch (const NeedMoreBytes&) {
      if (want == size) throw Error("{}: internal error: the header parse wanted more bytes", path);
      continue;
    }
    f.base_ = nullptr;
    f.metadata_only_ = true;
    return f;
  }
}

File::File(File&& o) noexcept { *this = std::move(o); }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    metadata_ = std::move(o.metadata_);
    metadata_offsets_ = std::move(o.metadata_offsets_);
    metadata_index_ = std::move(o.metadata_index_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
    metadata_only_ = o.metadata_only_;
  }
  return *this;
}

File::~File() { release(); }

void File::release_data() noexcept {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), static_cast<size_t>(size_));
  base_ = nullptr;
  metadata_only_ = true;
}

void File::discard_pages(std::span<const uint8_t> bytes) noexcept {
  if (base_ == nullptr || bytes.empty()) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base_), hi = lo + size_;
  const uintptr_t b = reinterpret_cast<uintptr_t>(bytes.data()), e = b + bytes.size();
  if (b < lo || e > hi) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (b + page - 1) / page * page, last = e / page * page;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void File::release() noexcept {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), static_cast<size_t>(size_));
  base_ = nullptr;
  size_ = 0;
}

// ---------------------------------------------------------------------------
// File: tensors
// ---------------------------------------------------------------------------
const TensorInfo* File::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(std::string_view name) const {
  if (const TensorInfo* t = find_tensor(name)) return *t;
  throw Error("{}: tensor '{}' not found ({} tensors in file)", path_, name, tensors_.size());
}

std::span<const uint8_t> File::tensor_data(const TensorInfo& t) const {
  if (metadata_only_)
    throw Error("{}: tensor '{}': the file was opened for its metadata only (open_metadata)", path_,
                t.name);
  if (find_type_traits(t.type) == nullptr)
    throw Error(
        "{}: offset {}: tensor '{}': unknown tensor type {}, its data size cannot be computed",
        path_, t.info_offset, t.name, static_cast<uint32_t>(t.type));
  const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  if (base_ == nullptr || t.offset > data_size || t.n_bytes > data_size - t.offset)
    throw Error(
        "{}: offset {}: tensor '{}': data [{}, +{}) lies outside the data section ({} bytes)",
        path_, t.info_offset, t.name, t.offset, t.n_bytes, data_size);
  return {base_ + data_offset_ + t.offset, static_cast<size_t>(t.n_bytes)};
}

}  // namespace touchstone::gguf
