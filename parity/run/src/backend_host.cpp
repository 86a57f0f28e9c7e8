#include "touchstone/run/backend_host.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "touchstone/model/tokenizer.h"
#include "touchstone/report/report.h"
#include "touchstone/run/model_support.h"
#include "touchstone/runtime/process_tree.h"

namespace touchstone {

BackendLibrary& BackendHost::library() {
  if (lib_ && !lib_->alive()) {
    session_.reset();
    model_.reset();
    lib_->restart();
  }
  if (!lib_) {
    lib_ = o_.in_process && !is_http_backend(o_.backend)
               ? BackendLibrary::load(o_.backend)
               : BackendLibrary::spawn(o_.backend, ChildOptions{o_.call_timeout_s, ""});
  }
  return *lib_;
}

BackendSession& BackendHost::session() {
  if (session_) return *session_;
  BackendLibrary& lib = library();
  // The contract's strings are UTF-8 (docs/contract.md): reports carry them.
  for (const std::string* s : {&lib.name(), &lib.version(), &lib.device_name()}) {
    if (sanitize_utf8(*s) != *s) {
      throw BackendError(TS_ERR_INTERNAL,
                         fmt::format("backend '{}': contract: name, version or device_name is "
                                     "not valid UTF-8: {:?}",
                                     sanitize_utf8(lib.name()), *s));
    }
  }
  if (!model_) {
    // ABI v3: a model the backend does not declare is UNSUPPORTED without loading it.
    if (auto why = undeclared_model_support(lib, o_.model_path)) {
      throw BackendError(TS_ERR_UNSUPPORTED, *why);
    }
    model_ = std::make_unique<BackendModel>(lib_, o_.model_path);
    if (!o_.vision_fault.empty()) model_->set_vision_fault(o_.vision_fault);
  }
  if (o_.expected_n_vocab > 0 && model_->n_vocab() != o_.expected_n_vocab) {
    const int32_t got = model_->n_vocab();
    model_.reset();
    throw BackendError(TS_ERR_INTERNAL,
                       fmt::format("backend '{}' ({}): n_vocab() is {}, the model's vocabulary "
                                   "has {} tokens; no logits were requested",
                                   lib.name(), lib.path(), got, o_.expected_n_vocab));
  }
  session_ = std::make_unique<BackendSession>(*model_, o_.session);
  return *session_;
}

void BackendHost::discard() {
  session_.reset();
  model_.reset();
}

std::string BackendHost::execution() const {
  if (is_http_backend(o_.backend)) {
    return fmt::format("HTTP server (time limit {:g} s per request)", o_.call_timeout_s);
  }
  return o_.in_process
             ? "in process"
             : fmt::format("child process (time limit {:g} s per call; its processes ended by {})",
                           o_.call_timeout_s, proc::cleanup_mechanism());
}

namespace {
std::atomic<bool> g_guard_armed{false};
std::string g_guard_backend;

void exit_guard() {
  if (!g_guard_armed.load()) return;
  std::fprintf(stderr,
               "touchstone: error: backend '%s' called exit() inside the harness process before "
               "the verdict was written; no verdict (run without --in-process to get a report)\n",
               g_guard_backend.c_str());
  std::fflush(stderr);
  ::_exit(2);  // the CLI's exit code for an error
}
}  // namespace

void arm_exit_guard(const std::string& backend) {
  static const bool registered = std::atexit(exit_guard) == 0;
  (void)registered;
  g_guard_backend = backend;
  g_guard_armed = true;
}

void disarm_exit_guard() { g_guard_armed = false; }

}  // namespace touchstone
