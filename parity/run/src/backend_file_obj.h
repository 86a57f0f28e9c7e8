// backend_file_obj.h - the strict JSON object reader of backend.json
// (backend_file.cpp, backend_file_ctest.cpp): every member checked for its
// type, unknown members an error naming the file and JSON pointer.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/run/backend_file.h"

namespace touchstone::backend_file {

using nlohmann::json;

// Reads the members of one JSON object, each checked for its type; unknown
// members are an error (a misspelt key must not be ignored).
struct Obj {
  const json& j;
  std::string file, ptr;
  std::vector<std::string> allowed;
  void check() const {
    if (!j.is_object()) throw Error("{}: {}: expected an object", file, ptr.empty() ? "/" : ptr);
    for (const auto& [k, v] : j.items())
      if (std::ranges::count(allowed, k) == 0)
        throw Error("{}: {}/{}: unknown member (expected one of: {})", file, ptr, k,
                    fmt::join(allowed, ", "));
  }
  std::string str(const char* k, bool required = false) const {
    if (!j.contains(k)) {
      if (required) throw Error("{}: {}/{}: missing", file, ptr, k);
      return "";
    }
    if (!j[k].is_string()) throw Error("{}: {}/{}: expected a string", file, ptr, k);
    return j[k].get<std::string>();
  }
  std::vector<std::string> strs(const char* k) const {
    std::vector<std::string> out;
    if (!j.contains(k)) return out;
    if (!j[k].is_array()) throw Error("{}: {}/{}: expected an array of strings", file, ptr, k);
    for (const json& v : j[k]) {
      if (!v.is_string()) throw Error("{}: {}/{}: expected an array of strings", file, ptr, k);
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  int integer(const char* k, int dflt) const {
    if (!j.contains(k)) return dflt;
    if (!j[k].is_number_integer()) throw Error("{}: {}/{}: expected an integer", file, ptr, k);
    return j[k].get<int>();
  }
  bool boolean(const char* k, bool dflt) const {
    if (!j.contains(k)) return dflt;
    if (!j[k].is_boolean()) throw Error("{}: {}/{}: expected true or false", file, ptr, k);
    return j[k].get<bool>();
  }
};

inline void check_weights(const std::string& file, const std::string& ptr, const std::string& w) {
  if (w != "full_precision" && w != "quantized")
    throw Error("{}: {}/weights: '{}' (expected full_precision or quantized)", file, ptr, w);
}

// The members structured, contract, faults, testmodels and adjust (each an
// array, absent = empty) into b; each weight path named must have a /parity
// entry where the CTests take its profile.
void read_ctest_members(const json& j, const std::string& path, BackendFile& b);

}  // namespace touchstone::backend_file
