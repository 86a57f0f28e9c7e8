#include "touchstone/backend.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "touchstone/error.h"

namespace touchstone {
namespace fs = std::filesystem;

const char* status_name(ts_status s) {
  switch (s) {
    case TS_OK:
      return "TS_OK";
    case TS_ERR_INVALID_ARGUMENT:
      return "TS_ERR_INVALID_ARGUMENT";
    case TS_ERR_UNSUPPORTED:
      return "TS_ERR_UNSUPPORTED";
    case TS_ERR_IO:
      return "TS_ERR_IO";
    case TS_ERR_OUT_OF_MEMORY:
      return "TS_ERR_OUT_OF_MEMORY";
    case TS_ERR_CONTEXT_FULL:
      return "TS_ERR_CONTEXT_FULL";
    case TS_ERR_DEVICE:
      return "TS_ERR_DEVICE";
    case TS_ERR_INTERNAL:
      return "TS_ERR_INTERNAL";
  }
  return "TS_ERR_UNKNOWN";
}

namespace {

std::vector<fs::path> search_dirs() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("TOUCHSTONE_BACKEND_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      const size_t end = s.find(':', start);
      const std::string part =
          s.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!part.empty()) dirs.emplace_back(part);
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "lib");
  return dirs;
}

}  // namespace

std::shared_ptr<BackendLibrary> BackendLibrary::load(const std::string& name_or_path) {
  std::string path;
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 3 && name_or_path.ends_with(".so"));
  if (is_path) {
    path = name_or_path;
    if (!fs::exists(path)) throw Error("backend library '{}' does not exist", path);
  } else {
    const std::string file = "libtouchstone_backend_" + name_or_path + ".so";
    std::string tried;
    for (const fs::path& dir : search_dirs()) {
      const fs::path candidate = dir / file;
      if (fs::exists(candidate)) {
        path = candidate.string();
        break;
      }
      tried += "\n  " + candidate.string();
    }
    if (path.empty()) {
      throw Error(
          "backend '{}' not found; looked for:{}\n(set TOUCHSTONE_BACKEND_PATH or pass a path)",
          name_or_path, tried);
    }
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw Error("cannot load backend '{}': {}", path, dlerror());
  auto entry = reinterpret_cast<ts_backend_entry_fn>(dlsym(handle, TS_BACKEND_ENTRY_SYMBOL));
  if (!entry) {
    dlclose(handle);
    throw Error("backend '{}' does not export {}()", path, TS_BACKEND_ENTRY_SYMBOL);
  }
  const ts_backend* api = entry();
  if (!api) {
    dlclose(handle);
    throw Error("backend '{}': {}() returned NULL", path, TS_BACKEND_ENTRY_SYMBOL);
  }
  if (api->api_version < 1 || api->api_version > TS_BACKEND_API_VERSION) {
    const uint32_t v = api->api_version;
    dlclose(handle);
    throw Error("backend '{}' implements api_version {}, this harness supports 1..{}", path, v,
                TS_BACKEND_API_VERSION);
  }
  const bool complete = api->last_error && api->device_name && api->capabilities &&
                        api->load_model && api->free_model && api->n_vocab && api->open_session &&
                        api->free_session && api->prefill && api->decode && api->rewind &&
                        api->position;
  {
    if (!complete) {
      dlclose(handle);
      throw Error("backend '{}' leaves a required function pointer NULL", path);
    }
  }
  std::shared_ptr<BackendLibrary> lib(new BackendLibrary(handle, api, path));
  if (api->api_version >= 2) {
    // The greedy entry is used only when the backend claims the capability;
    // claiming it with a NULL entry is an error. A backend that cannot report
    // capabilities now (no device) is loaded without it: its later calls fail
    // with their own status.
    bool claims = false;
    try {
      claims = (lib->capabilities().flags & TS_CAP_DEVICE_GREEDY) != 0;
    } catch (const std::exception&) {
      claims = false;
    }
    if (claims && !api->prefill_greedy) {
      throw Error("backend '{}' claims TS_CAP_DEVICE_GREEDY but prefill_greedy is NULL", path);
    }
    if (claims) lib->greedy_ = api->prefill_greedy;
  }
  return lib;
}

BackendLibrary::~BackendLibrary() {
  // Backends may own threads/driver state with static destructors; unloading
  // them at exit is a common source of crashes, so the handle is kept open.
  (void)handle_;
}

std::string BackendLibrary::device_name() const {
  const char* d = api_->device_name();
  return d ? d : "(unknown device)";
}

ts_capabilities BackendLibrary::capabilities() const {
  ts_capabilities caps{};
  caps.struct_size = sizeof(caps);
  check(api_->capabilities(&caps), "capabilities");
  return caps;
}

void BackendLibrary::check(ts_status status, const char* what) const {
  if (status == TS_OK) return;
  const char* msg = api_->last_error();
  throw BackendError(status, fmt::format("backend '{}': {}: {}: {}", api_->name, what,
                                         status_name(status), msg && *msg ? msg : "(no message)"));
}

Model::Model(std::shared_ptr<BackendLibrary> lib, const std::string& gguf_path)
    : lib_(std::move(lib)) {
  lib_->check(lib_->api().load_model(gguf_path.c_str(), &model_), "load_model");
}

Model::~Model() {
  if (model_) lib_->api().free_model(model_);
}

int32_t Model::n_vocab() const { return lib_->api().n_vocab(model_); }

Session::Session(const Model& model, const SessionOptions& o) : lib_(model.library()) {
  ts_session_options opt{};
  opt.struct_size = sizeof(opt);
  opt.weight_path = o.weight_path;
  opt.n_threads = o.n_threads;
  opt.max_context = o.max_context;
  opt.fault = o.fault.empty() ? nullptr : o.fault.c_str();
  lib_->check(lib_->api().open_session(model.handle(), &opt, &session_), "open_session");
  n_vocab_ = model.n_vocab();
}

Session::~Session() {
  if (session_) lib_->api().free_session(session_);
}

std::vector<float> Session::prefill(std::span<const int32_t> tokens) {
  std::vector<float> logits(static_cast<size_t>(n_vocab_));
  lib_->check(
      lib_->api().prefill(session_, tokens.data(), int32_t(tokens.size()), 0, logits.data()),
      "prefill");
  return logits;
}

std::vector<float> Session::prefill_all(std::span<const int32_t> tokens) {
  std::vector<float> logits(tokens.size() * size_t(n_vocab_));
  lib_->check(
      lib_->api().prefill(session_, tokens.data(), int32_t(tokens.size()), 1, logits.data()),
      "prefill(all positions)");
  return logits;
}

void Session::decode(int32_t token, std::span<float> logits) {
  if (logits.size() != size_t(n_vocab_)) {
    throw Error("decode: logits buffer holds {} floats, n_vocab is {}", logits.size(), n_vocab_);
  }
  lib_->check(lib_->api().decode(session_, token, logits.data()), "decode");
}

int32_t Session::prefill_greedy(std::span<const int32_t> tokens) {
  const auto fn = lib_->prefill_greedy();
  if (!fn) throw Error("{}: backend has no device greedy (TS_CAP_DEVICE_GREEDY)", lib_->name());
  int32_t tok = -1;
  lib_->check(fn(session_, tokens.data(), int32_t(tokens.size()), &tok), "prefill_greedy");
  if (tok < 0 || tok >= n_vocab_) {
    throw Error("{}: prefill_greedy returned token {} outside [0, {})", lib_->name(), tok,
                n_vocab_);
  }
  return tok;
}

void Session::rewind(int32_t position) {
  lib_->check(lib_->api().rewind(session_, position), "rewind");
}

int32_t Session::position() const { return lib_->api().position(session_); }

}  // namespace touchstone
