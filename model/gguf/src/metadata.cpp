// metadata.cpp - File's metadata lookups and typed getters.
//
// Integer getters accept any of the eight integer types as long as the value
// fits the requested type; float getters accept FLOAT32 and FLOAT64. Errors
// name the file, the byte offset of the key/value record, the key and the
// type actually stored.
#include <limits>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"

namespace touchstone::gguf {

namespace {

bool is_integer_type(ValueType t) {
  Value probe;
  probe.type = t;
  return probe.is_integer();
}

bool is_float_type(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

// Value of an integer Value as int64 / uint64, nullopt when it does not fit.
std::optional<int64_t> as_int(const Value& v) {
  if (const auto* s = std::get_if<int64_t>(&v.v)) return *s;
  if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<uint64_t> as_uint(const Value& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const auto* s = std::get_if<int64_t>(&v.v)) {
    if (*s >= 0) return static_cast<uint64_t>(*s);
  }
  return std::nullopt;
}

std::string describe(const Value& v) {
  if (const auto* s = std::get_if<int64_t>(&v.v)) return std::to_string(*s);
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return std::to_string(*u);
  return v.type_string();
}

}  // namespace

const Value* File::lookup(std::string_view key, uint64_t* offset) const {
  const auto it = metadata_index_.find(key);
  if (it == metadata_index_.end()) return nullptr;
  if (offset != nullptr) *offset = metadata_offsets_[it->second];
  return &metadata_[it->second].second;
}

bool File::has(std::string_view key) const { return lookup(key, nullptr) != nullptr; }

const Value& File::get(std::string_view key) const {
  if (const Value* v = lookup(key, nullptr)) return *v;
  throw Error("{}: metadata key '{}' not found", path_, key);
}

void File::wrong_type(std::string_view key, const Value& val, std::string_view wanted) const {
  uint64_t at = 0;
  lookup(key, &at);
  throw Error("{}: offset {}: metadata key '{}': expected {}, found {}", path_, at, key, wanted,
              val.type_string());
}

uint64_t File::get_uint(std::string_view key) const {
  const Value& v = get(key);
  if (!v.is_integer()) wrong_type(key, v, "an unsigned integer");
  if (auto u = as_uint(v)) return *u;
  wrong_type(key, v, fmt::format("a non-negative integer (value {})", describe(v)));
}

int64_t File::get_int(std::string_view key) const {
  const Value& v = get(key);
  if (!v.is_integer()) wrong_type(key, v, "an integer");
  if (auto s = as_int(v)) return *s;
  wrong_type(key, v, fmt::format("an integer that fits int64 (value {})", describe(v)));
}

double File::get_float(std::string_view key) const {
  const Value& v = get(key);
  if (!v.is_float()) wrong_type(key, v, "FLOAT32 or FLOAT64");
  return std::get<double>(v.v);
}

bool File::get_bool(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::BOOL) wrong_type(key, v, "BOOL");
  return std::get<bool>(v.v);
}

std::string File::get_string(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::STRING) wrong_type(key, v, "STRING");
  return std::get<std::string>(v.v);
}

std::vector<std::string> File::get_string_array(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::ARRAY || v.array_type != ValueType::STRING)
    wrong_type(key, v, "ARRAY[STRING]");
  const auto& elems = std::get<std::vector<Value>>(v.v);
  std::vector<std::string> out;
  out.reserve(elems.size());
  for (const Value& e : elems) out.push_back(std::get<std::string>(e.v));
  return out;
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::ARRAY || !is_integer_type(v.array_type))
    wrong_type(key, v, "an ARRAY of integers");
  const auto& elems = std::get<std::vector<Value>>(v.v);
  std::vector<int64_t> out;
  out.reserve(elems.size());
  for (size_t i = 0; i < elems.size(); ++i) {
    auto s = as_int(elems[i]);
    if (!s)
      wrong_type(key, v,
                 fmt::format("integers that fit int64 (element #{} is {})", i, describe(elems[i])));
    out.push_back(*s);
  }
  return out;
}

std::vector<double> File::get_float_array(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::ARRAY || !is_float_type(v.array_type))
    wrong_type(key, v, "an ARRAY of FLOAT32/FLOAT64");
  const auto& elems = std::get<std::vector<Value>>(v.v);
  std::vector<double> out;
  out.reserve(elems.size());
  for (const Value& e : elems) out.push_back(std::get<double>(e.v));
  return out;
}

std::optional<uint64_t> File::find_uint(std::string_view key) const {
  return has(key) ? std::optional<uint64_t>(get_uint(key)) : std::nullopt;
}
std::optional<int64_t> File::find_int(std::string_view key) const {
  return has(key) ? std::optional<int64_t>(get_int(key)) : std::nullopt;
}
std::optional<double> File::find_float(std::string_view key) const {
  return has(key) ? std::optional<double>(get_float(key)) : std::nullopt;
}
std::optional<bool> File::find_bool(std::string_view key) const {
  return has(key) ? std::optional<bool>(get_bool(key)) : std::nullopt;
}
std::optional<std::string> File::find_string(std::string_view key) const {
  return has(key) ? std::optional<std::string>(get_string(key)) : std::nullopt;
}

}  // namespace touchstone::gguf
