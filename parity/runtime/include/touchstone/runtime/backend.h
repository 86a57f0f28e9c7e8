// touchstone/runtime/backend.h - C++ view of the session contract for the harness side.
//
// Loads a backend library (by name or path), checks its api_version, and wraps
// the C ABI (touchstone/abi/backend_abi.h) in RAII types that throw touchstone::Error
// with the backend's own message. Backends themselves never include this file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "touchstone/abi/backend_abi.h"
#include "touchstone/common/error.h"
#include "touchstone/runtime/backend_channel.h"

namespace touchstone {

// How a batch of sessions advances (ABI v6 step_batch), as the report says it.
enum class BatchMode {
  kNative,       // step_batch with TS_CAP_BATCHED_SESSIONS: one forward pass
  kBackendLoop,  // step_batch without it: the backend runs the entries one by one
  kHarness       // no step_batch: the harness calls prefill for each entry in order
};
// "native", "looped by the backend", "emulated by the harness".
const char* batch_mode_name(BatchMode mode);

// One loaded backend: in this process (dlopen) or in a child process
// (`touchstone-backend-runner`, see touchstone/runtime/backend_channel.h).
class BackendLibrary {
 public:
  // `name_or_path`: a path (contains '/' or ends in ".so") is dlopen()ed as is;
  // a bare name N is searched as libtouchstone_backend_N.so in, in order:
  // $TOUCHSTONE_BACKEND_PATH (colon-separated), then <dir of this executable>/../lib.
  // Throws Error naming every place searched, a dlerror, or an api_version mismatch
  // ("exec:CMD..." too: a command runs only in a child process, see spawn).
  static std::shared_ptr<BackendLibrary> load(const std::string& name_or_path);
  // The same library run in a child process: every call has a time limit, and
  // a crash, exit, hang or protocol violation throws BackendCrash instead of
  // taking the caller down. Load errors are the runner's, with the same text.
  // "exec:CMD ARGS..." runs CMD (split on whitespace, found on PATH) as the
  // child instead of the runner: a program that speaks the protocol itself on
  // fd 3 (python/touchstone_engine); path() is then the command line.
  static std::shared_ptr<BackendLibrary> spawn(const std::string& name_or_path,
                                               const ChildOptions& options);
  explicit BackendLibrary(std::unique_ptr<BackendChannel> channel) : channel_(std::move(channel)) {}
  BackendLibrary(const BackendLibrary&) = delete;
  BackendLibrary& operator=(const BackendLibrary&) = delete;

  BackendChannel& channel() const { return *channel_; }
  // The table's api_version (1 .. TS_BACKEND_API_VERSION).
  uint32_t api_version() const { return info().api_version; }
  // A version >= 2 table whose capabilities claim TS_CAP_DEVICE_GREEDY with a
  // non-NULL prefill_greedy (never read past a version-1 table).
  bool has_device_greedy() const { return info().device_greedy; }
  // A version >= 4 table with set_taps and read_taps (layer taps).
  bool has_taps() const { return info().taps; }
  // ABI v6: how BackendSession::step_batch runs here, and whether fork_session is the
  // backend's own (else BackendSession::fork re-prefills the prefix: emulated).
  BatchMode batch_mode() const;
  bool has_fork() const { return info().fork; }
  // ABI v7: set_grammar, grammar_mask and grammar_greedy are the backend's own
  // (with TS_CAP_STRUCTURED_OUTPUT): it enforces grammars itself.
  bool has_grammar() const { return info().grammar; }
  // ABI v8: prefill_embeddings (TS_CAP_EMBEDDING_INPUT); load_vision + encode_image
  // (TS_CAP_MULTIMODAL).
  bool has_embeddings() const { return info().embeddings; }
  bool has_vision() const { return info().vision; }
  // ABI v9: preprocess_image (the backend's own pixel tensor) and set_vision_options.
  bool has_preprocess() const { return info().preprocess; }
  bool has_vision_options() const { return info().vision_options; }
  const std::string& name() const { return info().name; }
  const std::string& version() const { return info().version; }
  const std::string& path() const { return info().path; }
  const std::string& device_name() const { return info().device; }
  ts_capabilities capabilities() const { return channel_->capabilities(); }
  // Child process: false after it died; restart() starts a fresh one (models
  // and sessions of the old one must be dropped first).
  bool alive() const { return channel_->alive(); }
  void restart() { channel_->restart(); }

 private:
  const BackendInfo& info() const { return channel_->info(); }
  std::unique_ptr<BackendChannel> channel_;
};

const char* status_name(ts_status s);

class BackendModel {
 public:
  BackendModel(std::shared_ptr<BackendLibrary> lib, const std::string& gguf_path);
  ~BackendModel();
  BackendModel(const BackendModel&) = delete;
  BackendModel& operator=(const BackendModel&) = delete;
  int32_t n_vocab() const;
  Handle handle() const { return model_; }
  const std::shared_ptr<BackendLibrary>& library() const { return lib_; }
  // ABI v8 (library()->has_vision(), else Error): attaches an mmproj GGUF's vision tower
  // (once: the same path again is a no-op);
  // then an image's projected embeddings (pixels: 3 x height x width float32, the
  // processor's output), n_floats = n_image_tokens x n_embd.
  void load_vision(const std::string& mmproj_path);
  std::vector<float> encode_image(ts_image_format format, std::span<const uint8_t> data,
                                  int32_t height, int32_t width, size_t n_floats);
  // ABI v9 (library()->has_preprocess(), else Error): the backend's own pixel tensor for a
  // decoded image (rgb: height x width x 3 bytes), after load_vision.
  PixelTensor preprocess_image(std::span<const uint8_t> rgb, int32_t height, int32_t width);
  // A fault for the vision path (a fault name of touchstone/model/faults.h, "" = none),
  // handed to the backend (ABI v9 set_vision_options) by every later load_vision, and at
  // once when a tower is attached. Error when the backend has no set_vision_options.
  void set_vision_fault(const std::string& fault);

 private:
  std::shared_ptr<BackendLibrary> lib_;
  Handle model_ = 0;
  int32_t n_vocab_ = 0;
  std::string vision_path_;   // the mmproj attached by load_vision ("" = none)
  std::string vision_fault_;  // set_vision_fault's ("" = none)
};

struct BackendSessionOptions {
  ts_weight_path weight_path = TS_WEIGHTS_FULL_PRECISION;
  int32_t n_threads = 0;
  int32_t max_context = 0;
  std::string fault;  // test-only fault injection ("" = none)
};

class BackendSession {
 public:
  BackendSession(const BackendModel& model, const BackendSessionOptions& options);
  ~BackendSession();
  BackendSession(const BackendSession&) = delete;
  BackendSession& operator=(const BackendSession&) = delete;

  // Logits of the last position, [n_vocab].
  std::vector<float> prefill(std::span<const int32_t> tokens);
  // Logits of every position, [n_tokens * n_vocab] row-major.
  std::vector<float> prefill_all(std::span<const int32_t> tokens);
  // The same rows, bounded in memory: `tokens` is prefilled in consecutive
  // all-position calls of at most max_rows() tokens each, and row(i, logits)
  // is called for every position i in order (logits: [n_vocab], valid during
  // the call). A 4,096-token passage of Gemma 3 (262,144-entry vocabulary)
  // would need 4.3 GB in one call.
  void prefill_all_rows(std::span<const int32_t> tokens,
                        const std::function<void(size_t, std::span<const float>)>& row);
  // Tokens per prefill_all_rows call: as many logits rows as fit in 512 MiB (>= 1).
  size_t max_rows() const;
  void decode(int32_t token, std::span<float> logits);
  // True when the backend computes the greedy token itself (TS_CAP_DEVICE_GREEDY).
  bool has_device_greedy() const { return lib_->has_device_greedy(); }
  // Appends `tokens` and returns the backend's own argmax of the last position
  // (prefill_greedy); throws Error when !has_device_greedy().
  int32_t prefill_greedy(std::span<const int32_t> tokens);
  void rewind(int32_t position);
  int32_t position() const;
  // Layer taps (ABI v4): has_taps(), then set_taps(true) before the calls to
  // record; read_taps(n) returns the last recorded position's activations,
  // n = n_layer * TS_TAP_POINTS * n_embd floats. Throw Error without taps.
  bool has_taps() const { return lib_->has_taps(); }
  void set_taps(bool enable);
  std::vector<float> read_taps(size_t n_floats);
  int32_t n_vocab() const { return n_vocab_; }
  // ABI v5: N when the backend's rows are top-N log-probabilities
  // (TS_CAP_TOP_N_LOGPROBS), else 0. Asks capabilities() once; throws its error.
  int32_t top_n_logprobs();

  // ---- ABI v6 [serving] (docs/serving-checks.md) ----
  // One sequence's share of step_batch: logits holds n_vocab floats, or
  // tokens.size() * n_vocab when all_positions.
  struct Step {
    BackendSession* session = nullptr;
    std::span<const int32_t> tokens;
    bool all_positions = false;
    std::span<float> logits;
  };
  // Advances every step's session (distinct sessions of one model and weight
  // path): through the backend's step_batch when it has one, else (BatchMode::
  // kHarness) one prefill per step, in order. Each step's logits are defined as
  // prefill's. Throws Error for a wrong buffer size or a repeated session,
  // BackendError with the backend's message otherwise.
  static void step_batch(std::span<const Step> steps);
  // A new session holding this one's first n_prefix positions (0 <= n_prefix <=
  // position()): the backend's fork_session when it has one, else a fresh
  // session with the same options that prefills the same n_prefix tokens
  // (emulated: the harness knows every token it appended).
  std::unique_ptr<BackendSession> fork(int32_t n_prefix);
  bool fork_native() const { return lib_->has_fork(); }
  // ---- ABI v8 [multimodal] (docs/vision.md) ----
  // Appends embeddings.size() / n_embd input embeddings (an image's tokens) and returns
  // the logits of the last (or, all_positions, of every) position. Throws Error when
  // the backend has no prefill_embeddings. In history() each such position is -1; an
  // emulated fork of a prefix holding one is refused (it replays tokens only).
  std::vector<float> prefill_embeddings(std::span<const float> embeddings, int32_t n_embd,
                                        bool bidirectional, bool all_positions);
  bool has_embeddings() const { return lib_->has_embeddings(); }
  // The tokens in the KV cache, as the harness appended them (position() of them).
  const std::vector<int32_t>& history() const { return history_; }

  // ---- ABI v7 [structured output] (docs/structured-output.md) ----
  // Only on a backend with has_grammar() (else Error). set_grammar: from
  // position() on, appended tokens must follow the grammar (kind:
  // TS_GRAMMAR_*; a refused token fails the appending call, BackendError with
  // TS_ERR_INVALID_ARGUMENT); clear_grammar removes it. grammar_mask: the
  // backend's allowed set now, TS_MASK_WORDS(n_vocab) words. grammar_greedy:
  // the backend's constrained picks of the last n positions of the last call
  // (-1 where nothing is allowed). A fork carries the grammar (an emulated fork
  // sets it again where it was set and prefills the rest).
  void set_grammar(ts_grammar_kind kind, const std::string& text);
  void clear_grammar();
  std::vector<uint32_t> grammar_mask();
  // grammar_mask(), or nullopt where the backend enforces grammars without
  // exposing its allowed sets (TS_ERR_UNSUPPORTED: a completion server).
  std::optional<std::vector<uint32_t>> exposed_grammar_mask();
  std::vector<int32_t> grammar_greedy(int32_t n_positions = 1);
  bool grammar_set() const { return grammar_start_ >= 0; }
  // The backend enforces grammars itself (BackendLibrary::has_grammar).
  bool grammar_enforced() const { return lib_->has_grammar(); }

 private:
  BackendSession(const BackendModel& model, const BackendSessionOptions& options, Handle forked);
  void appended(std::span<const int32_t> tokens) {
    history_.insert(history_.end(), tokens.begin(), tokens.end());
  }
  std::shared_ptr<BackendLibrary> lib_;
  const BackendModel* model_ = nullptr;
  BackendSessionOptions options_;
  Handle session_ = 0;
  int32_t n_vocab_ = 0;
  int32_t top_n_ = -1;  // -1 = not asked yet
  std::vector<int32_t> history_;
  // The grammar set on the session (ABI v7), for an emulated fork: where it was
  // set (-1 = none), its kind and text.
  int32_t grammar_start_ = -1;
  ts_grammar_kind grammar_kind_ = TS_GRAMMAR_GBNF;
  std::string grammar_text_;
};

}  // namespace touchstone
