// backend_table.h - the llama.cpp backend's ts_backend table, dlopen'ed from
// the path CMake compiles in (TOUCHSTONE_LLAMACPP_BACKEND), once per process.
#pragma once

#include <dlfcn.h>

#include <stdexcept>
#include <string>

#include "touchstone/abi/backend_abi.h"

namespace touchstone::llamacpp::test {

inline const ts_backend* backend_table() {
  static const ts_backend* table = [] {
    void* lib = dlopen(TOUCHSTONE_LLAMACPP_BACKEND, RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    using Entry = const ts_backend* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(lib, TS_BACKEND_ENTRY_SYMBOL));
    if (!entry) throw std::runtime_error("no " TS_BACKEND_ENTRY_SYMBOL " in the backend");
    return entry();
  }();
  return table;
}

}  // namespace touchstone::llamacpp::test
