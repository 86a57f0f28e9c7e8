// touchstone/common/error.h - the exception types used inside Touchstone: Error, and
// UnsupportedModel for a model that is refused rather than computed.
//
// Every error that reaches a user names *where* it happened: the file, the
// byte offset or the field. Exceptions never cross the backend C ABI
// (touchstone/abi/backend_abi.h); they are turned into status codes there.
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

// The file describes a model this code does not compute (an unknown key such
// as llama.rope.scaling.type = "yarn", an extra tensor, an unknown architecture):
// computing it while ignoring that part would silently give the wrong model, so it
// is refused (TS_ERR_UNSUPPORTED through the ABI, touchstone/abi/backend_impl.h).
class UnsupportedModel : public Error {
 public:
  using Error::Error;
};

}  // namespace touchstone
