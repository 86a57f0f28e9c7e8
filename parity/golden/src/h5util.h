// Internal: RAII for HDF5 ids and error-stack helpers. Not installed.
#pragma once

#include <hdf5.h>

#include <string>
#include <utility>

namespace touchstone::h5 {

// Owns one hid_t and closes it with the matching H5?close function.
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      close();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~Id() { close(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: convenience for the C API
  bool valid() const { return id_ >= 0; }
  // Returns the closer's status (< 0 on failure); no-op when invalid.
  herr_t close() {
    herr_t r = 0;
    if (id_ >= 0 && closer_ != nullptr) r = closer_(id_);
    id_ = H5I_INVALID_HID;
    return r;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Turns off HDF5's automatic printing of error stacks (idempotent).
void silence_errors();

// The innermost message of the current HDF5 error stack ("" if none), then
// clears the stack.
std::string take_error();

// " (HDF5: <innermost message>)", or "" when the stack is empty; clears it.
std::string error_suffix();

// A fresh name for an in-memory (core driver) file. The core driver refuses
// to open an image under the name of a file that exists on disk, and must
// never touch the disk, so the name is one that cannot exist (below /dev/null).
std::string memory_name();

}  // namespace touchstone::h5
