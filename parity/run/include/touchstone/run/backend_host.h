// A backend for the CLI's commands: loaded in a child process (default) or in
// process (--in-process), with a model and a session created on demand and
// thrown away after a backend failure, so the next case starts clean.
#pragma once

#include <memory>
#include <string>

#include "touchstone/runtime/backend.h"

namespace touchstone {

struct HostOptions {
  std::string backend;  // name or library path
  bool in_process = false;
  double call_timeout_s = 300.0;  // child process only
  std::string model_path;
  BackendSessionOptions session;
  // The model's vocabulary size (tokenizer / goldens); a backend reporting
  // another n_vocab is refused before any logits are requested from it.
  int32_t expected_n_vocab = 0;
  // A vision-path fault (touchstone/model/faults.h, Faults::vision_path) for the model's
  // tower (BackendModel::set_vision_fault), "" = none.
  std::string vision_fault;
};

class BackendHost {
 public:
  explicit BackendHost(HostOptions o) : o_(std::move(o)) {}
  // Loads the library (once; again after a crash), the model and a session.
  // Throws BackendError/BackendCrash from the backend, Error for load errors.
  BackendSession& session();
  // The loaded model (loads it, and opens the session, when needed).
  BackendModel& model() {
    session();
    return *model_;
  }
  BackendLibrary& library();
  // After a failed call: drops the session and model; a dead child is
  // restarted on the next session().
  void discard();
  // "child process (time limit N s per call; its processes ended by cgroup v2)"
  // (or "... by process-group sweep"), "in process" or "HTTP server (...)".
  std::string execution() const;

 private:
  HostOptions o_;
  std::shared_ptr<BackendLibrary> lib_;
  std::unique_ptr<BackendModel> model_;
  std::unique_ptr<BackendSession> session_;
};

// In process only: a backend that calls exit() must not end the harness with
// its status. Until disarmed, an exit() prints what happened and exits 2.
void arm_exit_guard(const std::string& backend);
void disarm_exit_guard();

}  // namespace touchstone
