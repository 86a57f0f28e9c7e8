// touchstone/error.h - the one exception type used inside Touchstone.
//
// Every error that reaches a user names *where* it happened: the file, the
// byte offset or the field. Exceptions never cross the backend C ABI
// (touchstone/backend_abi.h); they are turned into status codes there.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace touchstone {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}

  template <typename... Args>
  explicit Error(fmt::format_string<Args...> f, Args&&... args)
      : std::runtime_error(fmt::format(f, std::forward<Args>(args)...)) {}
};

}  // namespace touchstone
