// touchstone/backend.h - C++ view of the session contract for the harness side.
//
// Loads a backend library (by name or path), checks its api_version, and wraps
// the C ABI (touchstone/backend_abi.h) in RAII types that throw touchstone::Error
// with the backend's own message. Backends themselves never include this file.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "touchstone/backend_abi.h"
#include "touchstone/error.h"

namespace touchstone {

// An error reported by a backend through the C ABI; keeps its ts_status so
// callers can tell "no device here" (TS_ERR_DEVICE -> test SKIP) from a bug.
class BackendError : public Error {
 public:
  BackendError(ts_status status, const std::string& what) : Error(what), status_(status) {}
  ts_status status() const { return status_; }

 private:
  ts_status status_;
};

class BackendLibrary {
 public:
  // `name_or_path`: a path (contains '/' or ends in ".so") is dlopen()ed as is;
  // a bare name N is searched as libtouchstone_backend_N.so in, in order:
  // $TOUCHSTONE_BACKEND_PATH (colon-separated), then <dir of this executable>/../lib.
  // Throws Error naming every place searched, a dlerror, or an api_version mismatch.
  static std::shared_ptr<BackendLibrary> load(const std::string& name_or_path);
  ~BackendLibrary();
  BackendLibrary(const BackendLibrary&) = delete;
  BackendLibrary& operator=(const BackendLibrary&) = delete;

  const ts_backend& api() const { return *api_; }
  // The table's api_version (1 .. TS_BACKEND_API_VERSION).
  uint32_t api_version() const { return api_->api_version; }
  // prefill_greedy of a version >= 2 table whose capabilities claim
  // TS_CAP_DEVICE_GREEDY, else nullptr (never read past a version-1 table).
  decltype(ts_backend::prefill_greedy) prefill_greedy() const { return greedy_; }
  std::string name() const { return api_->name; }
  const std::string& path() const { return path_; }
  std::string device_name() const;
  ts_capabilities capabilities() const;
  // Throws BackendError "<backend>: <what>: <status>: <last_error>" when status != TS_OK.
  void check(ts_status status, const char* what) const;

 private:
  BackendLibrary(void* handle, const ts_backend* api, std::string path)
      : handle_(handle), api_(api), path_(std::move(path)) {}
  void* handle_;
  const ts_backend* api_;
  decltype(ts_backend::prefill_greedy) greedy_ = nullptr;
  std::string path_;
};

const char* status_name(ts_status s);

class Model {
 public:
  Model(std::shared_ptr<BackendLibrary> lib, const std::string& gguf_path);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  int32_t n_vocab() const;
  ts_model* handle() const { return model_; }
  const std::shared_ptr<BackendLibrary>& library() const { return lib_; }

 private:
  std::shared_ptr<BackendLibrary> lib_;
  ts_model* model_ = nullptr;
};

struct SessionOptions {
  ts_weight_path weight_path = TS_WEIGHTS_FULL_PRECISION;
  int32_t n_threads = 0;
  int32_t max_context = 0;
  std::string fault;  // test-only fault injection ("" = none)
};

class Session {
 public:
  Session(const Model& model, const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Logits of the last position, [n_vocab].
  std::vector<float> prefill(std::span<const int32_t> tokens);
  // Logits of every position, [n_tokens * n_vocab] row-major.
  std::vector<float> prefill_all(std::span<const int32_t> tokens);
  void decode(int32_t token, std::span<float> logits);
  // True when the backend computes the greedy token itself (TS_CAP_DEVICE_GREEDY).
  bool has_device_greedy() const { return lib_->prefill_greedy() != nullptr; }
  // Appends `tokens` and returns the backend's own argmax of the last position
  // (prefill_greedy); throws Error when !has_device_greedy().
  int32_t prefill_greedy(std::span<const int32_t> tokens);
  void rewind(int32_t position);
  int32_t position() const;
  int32_t n_vocab() const { return n_vocab_; }

 private:
  std::shared_ptr<BackendLibrary> lib_;
  ts_session* session_ = nullptr;
  int32_t n_vocab_ = 0;
};

}  // namespace touchstone
