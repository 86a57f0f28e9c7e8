// touchstone/runtime/backend_channel.h - how the harness reaches a backend.
//
// The session contract's calls (touchstone/abi/backend_abi.h), one virtual each,
// with C++ types. Two implementations:
//   - in process: the dlopen()ed ts_backend table, called directly;
//   - child process: the same calls sent to `touchstone-backend-runner` over
//     the protocol of touchstone/runtime/protocol.h, each with a time limit.
// A third way in: "exec:CMD ARGS..." starts CMD as the child instead of the
// runner; CMD speaks the protocol itself on fd 3 (e.g. a Python engine,
// python/touchstone_engine, docs/python-engines.md). It has no in-process mode.
// A fourth: "http://HOST:PORT", a llama.cpp llama-server over its /completion
// API (channel_http.cpp, docs/backends/http.md): top-N log-probability rows
// (ABI v5 TS_CAP_TOP_N_LOGPROBS), every request time-limited.
// Model and session handles are opaque 64-bit ids (the backend's pointers in
// process, the runner's ids in a child). Every call throws BackendError with
// the backend's status and message on a non-OK status, and BackendCrash when
// the backend process died, hung past the time limit or broke the protocol.
// Outputs are written only into the caller's buffers, whose sizes the caller
// states; a child that sends a different size is a protocol violation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "touchstone/abi/backend_abi.h"
#include "touchstone/common/error.h"
#include "touchstone/runtime/protocol.h"

namespace touchstone {

// An error reported by a backend through the C ABI; keeps its ts_status so
// callers can tell "no device here" (TS_ERR_DEVICE -> test SKIP) from a bug.
class BackendError : public Error {
 public:
  // `detail`: the backend's own last_error() text, when there is one.
  BackendError(ts_status status, const std::string& what, std::string detail = "")
      : Error(what), status_(status), detail_(std::move(detail)) {}
  ts_status status() const { return status_; }
  const std::string& detail() const { return detail_; }

 private:
  ts_status status_;
  std::string detail_;
};

// The backend process crashed, exited, hung or broke the protocol/contract.
// status() is TS_ERR_INTERNAL; what() names the signal/exit code or the limit.
class BackendCrash : public BackendError {
 public:
  explicit BackendCrash(const std::string& what) : BackendError(TS_ERR_INTERNAL, what) {}
};

using Handle = uint64_t;
using protocol::BackendInfo;

// One entry of BackendChannel::step_batch (ABI v6 ts_batch_entry): out.size()
// is n_vocab, or tokens.size() * n_vocab when all_positions.
struct BatchCall {
  Handle session = 0;
  std::span<const int32_t> tokens;
  bool all_positions = false;
  std::span<float> out;
};

// preprocess_image's result: n_frames x channels x height x width float32.
struct PixelTensor {
  int32_t n_frames = 0, channels = 0, height = 0, width = 0;
  std::vector<float> values;
};

class BackendChannel {
 public:
  virtual ~BackendChannel() = default;
  virtual const BackendInfo& info() const = 0;
  virtual ts_capabilities capabilities() = 0;
  virtual Handle load_model(const std::string& gguf_path, int32_t* n_vocab) = 0;
  virtual void free_model(Handle model) noexcept = 0;
  virtual Handle open_session(Handle model, const ts_session_options& options) = 0;
  virtual void free_session(Handle session) noexcept = 0;
  // out.size() must be n_vocab, or tokens.size() * n_vocab when all_positions.
  virtual void prefill(Handle session, std::span<const int32_t> tokens, bool all_positions,
                       std::span<float> out) = 0;
  virtual void decode(Handle session, int32_t token, std::span<float> out) = 0;
  virtual int32_t prefill_greedy(Handle session, std::span<const int32_t> tokens) = 0;
  virtual void rewind(Handle session, int32_t position) = 0;
  virtual int32_t position(Handle session) = 0;
  // Layer taps (ABI v4; info().taps): set_taps turns recording on/off;
  // read_taps fills out (n_layer * TS_TAP_POINTS * n_embd floats, the size the
  // backend expects) with the last recorded position. Both throw Error when
  // !info().taps.
  virtual void set_taps(Handle session, bool enable) = 0;
  virtual void read_taps(Handle session, std::span<float> out) = 0;
  // ABI v6 (info().step_batch / info().fork): every entry advanced in one call;
  // a session forked from `src` holding its first n_prefix KV entries. Both
  // throw Error when the backend lacks them (callers check info() first).
  virtual void step_batch(std::span<const BatchCall> entries);
  virtual Handle fork_session(Handle src, int32_t n_prefix);
  // ABI v7 (info().grammar): the session's grammar (nullptr removes it), its
  // allowed set now (out.size() == TS_MASK_WORDS(n_vocab)), and the backend's
  // constrained greedy picks of the last out.size() positions of its last call.
  // All throw Error when the backend lacks them.
  virtual void set_grammar(Handle session, const ts_grammar* grammar);
  virtual void grammar_mask(Handle session, std::span<uint32_t> out);
  virtual void grammar_greedy(Handle session, std::span<int32_t> out);
  // ABI v8 (info().embeddings / info().vision): n = embeddings.size() / n_embd input
  // embeddings appended as a prefill (out.size(): n_vocab, or n * n_vocab when
  // all_positions); a vision tower attached to the model from an mmproj GGUF; an image's
  // projected embeddings (data: the image's bytes in `format`, TS_IMAGE_PIXELS_F32 3 x
  // height x width float32 or TS_IMAGE_RGB8 height x width x 3 bytes; out.size(): the
  // tower's n_image_tokens x n_embd). All throw Error when the backend lacks them.
  virtual void prefill_embeddings(Handle session, std::span<const float> embeddings, int32_t n_embd,
                                  bool bidirectional, bool all_positions, std::span<float> out);
  virtual void load_vision(Handle model, const std::string& mmproj_path);
  virtual void encode_image(Handle model, ts_image_format format, std::span<const uint8_t> data,
                            int32_t height, int32_t width, std::span<float> out);
  // ABI v9 (info().preprocess / info().vision_options): the backend's own pixel tensor for
  // a decoded image (rgb: height x width x 3 bytes), and the vision path's fault ("" =
  // none). Both throw Error when the backend lacks them.
  virtual PixelTensor preprocess_image(Handle model, std::span<const uint8_t> rgb, int32_t height,
                                       int32_t width);
  virtual void set_vision_options(Handle model, const std::string& fault);
  // Child process only: false once the process died or was killed; restart()
  // starts a fresh one (every handle of the old one is gone).
  virtual bool alive() const { return true; }
  virtual void restart() {}
  // A server that tokenizes (http://): the ids it gives `text` (with its BOS
  // and special tokens, as its own prompts would be); nullopt elsewhere.
  virtual std::optional<std::vector<int32_t>> tokenize(const std::string& /*text*/) {
    return std::nullopt;
  }
};

// The bytes an image of `format` (ABI v8 ts_image_format) with 3 channels of height x
// width holds (float32 pixels or uint8 RGB); Error for a size that is not that.
void check_image_bytes(ts_image_format format, size_t bytes, int32_t height, int32_t width);
// t's value count (n_frames x channels x height x width); Error naming `what` and the
// shape unless it is at least one frame of 3 channels, at most 2^28 values.
size_t pixel_tensor_size(const PixelTensor& t, const char* what);

// dlopen()s the library (name or path, see BackendLibrary::load) and checks
// the table; throws Error naming the problem (an "exec:" command is refused:
// it runs only as a child process).
std::unique_ptr<BackendChannel> open_in_process(const std::string& name_or_path);

// "exec:CMD ARGS...": a program that speaks the child-process protocol itself,
// on fd 3. "stdio:CMD ARGS...": the same on CMD's stdin and stdout, for a
// backend on another machine ("stdio:ssh HOST touchstone-backend-runner --stdio
// LIB", docs/remote-backends.md). Both are commands ("exec backends").
inline constexpr std::string_view kExecPrefix = "exec:";
inline constexpr std::string_view kStdioPrefix = "stdio:";
inline bool is_stdio_backend(std::string_view spec) { return spec.starts_with(kStdioPrefix); }
inline bool is_exec_backend(std::string_view spec) {
  return spec.starts_with(kExecPrefix) || is_stdio_backend(spec);
}
// The argv of an exec: / stdio: backend: the text after the prefix split on
// whitespace (no quoting; a wrapper script takes arguments with spaces). Throws
// Error when empty.
std::vector<std::string> exec_command(std::string_view spec);

struct ChildOptions {
  double call_timeout_s = 300.0;  // per call; a call still running after it is a hang
  std::string runner;             // runner executable ("" = next to this executable)
};
// Starts `touchstone-backend-runner` for the library (or, for "exec:CMD...", CMD
// itself, found on PATH) with the socket on fd 3, and says hello.
std::unique_ptr<BackendChannel> open_child_process(const std::string& name_or_path,
                                                   const ChildOptions& options);

// "http://HOST:PORT" (or https://): a llama-server, see docs/backends/http.md.
inline bool is_http_backend(std::string_view spec) {
  return spec.starts_with("http://") || spec.starts_with("https://");
}
struct HttpOptions {
  double call_timeout_s = 300.0;     // per request (connect + answer)
  double connect_timeout_s = 10.0;   // of each request
  int64_t max_requests = 1'000'000;  // in all, for the channel's life
  int32_t top_n = 64;                // n_probs asked for every position
};
// The server's root URL without trailing '/'; throws Error for a path or no host.
std::string http_base_url(std::string_view spec);
// Asks the server's /props (its identity) and returns the channel; throws
// BackendError / BackendCrash naming the URL and what went wrong.
std::unique_ptr<BackendChannel> open_http(const std::string& spec, const HttpOptions& options);

// Resolves a backend name to a library path ($TOUCHSTONE_BACKEND_PATH, then
// <exe dir>/../lib); a path, or an "exec:" command, is returned as is. Throws Error
// listing the places tried.
std::string resolve_backend_path(const std::string& name_or_path);

// The directory of the file that holds the harness's code: the program's
// bin/ when the harness is linked statically (the CLI), the SDK's lib/ when it
// is libtouchstone_parity.so inside a team's own test binary (dladdr); empty
// when it cannot be told. The runner and the backends are found relative to it
// after the program's own directory (docs/sdk.md#googletest).
std::filesystem::path harness_code_dir();

}  // namespace touchstone
