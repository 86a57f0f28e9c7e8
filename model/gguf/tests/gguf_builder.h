// gguf_builder.h - test helpers: encode GGUF files byte by byte, temp files.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "touchstone/model/gguf.h"

namespace touchstone::gguf::testing {

/// Little-endian byte sink.
struct Bytes {
  std::vector<uint8_t> b;

  template <typename T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(const std::vector<uint8_t>& v) {
    b.insert(b.end(), v.begin(), v.end());
    return *this;
  }
  size_t size() const { return b.size(); }
};

/// Builds a GGUF file: header, key/values (pre-encoded), tensor infos,
/// padding, data. Tensor data is laid out back to back, each aligned; the
/// last tensor's data ends exactly at the end of the file.
struct GgufBuilder {
  uint32_t version = 3;
  uint64_t alignment = 32;
  uint64_t n_kv = 0;
  Bytes kv;
  struct Tensor {
    std::string name;
    std::vector<uint64_t> shape;
    uint32_t type;
    std::vector<uint8_t> data;
    std::optional<uint64_t> offset;  // overrides the computed data offset
  };
  std::vector<Tensor> tensors;

  /// Starts a key/value record; the caller then appends the value to `kv`.
  Bytes& key(std::string_view k, ValueType t) {
    ++n_kv;
    kv.str(k).put<uint32_t>(static_cast<uint32_t>(t));
    return kv;
  }
  void tensor(std::string name, std::vector<uint64_t> shape, TensorType type,
              std::vector<uint8_t> data) {
    tensors.push_back(
        {std::move(name), std::move(shape), static_cast<uint32_t>(type), std::move(data), {}});
  }

  std::vector<uint8_t> build() const {
    Bytes out;
    out.put<uint32_t>(0x46554747)
        .put<uint32_t>(version)
        .put<uint64_t>(tensors.size())
        .put<uint64_t>(n_kv);
    out.raw(kv.b);
    uint64_t off = 0;
    for (const Tensor& t : tensors) {
      out.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
      for (uint64_t d : t.shape) out.put<uint64_t>(d);
      out.put<uint32_t>(t.type).put<uint64_t>(t.offset.value_or(off));
      off += t.data.size();
      off = (off + alignment - 1) / alignment * alignment;
    }
    while (out.size() % alignment != 0) out.put<uint8_t>(0);
    for (size_t i = 0; i < tensors.size(); ++i) {
      out.raw(tensors[i].data);
      if (i + 1 < tensors.size())
        while (out.size() % alignment != 0) out.put<uint8_t>(0);
    }
    return out.b;
  }
};

/// A file under the gtest temp dir, removed on destruction.
class TempFile {
 public:
  explicit TempFile(const std::vector<uint8_t>& bytes, std::string_view stem = "t") {
    static int counter = 0;
    path_ = ::testing::TempDir() + "touchstone_gguf_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++) + "_" + std::string(stem) + ".gguf";
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace touchstone::gguf::testing
