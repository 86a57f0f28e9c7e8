// The child-process channel: the backend runs in `touchstone-backend-runner`,
// reached over a socketpair with the protocol of touchstone/runtime/protocol.h. Every
// call has a deadline; a hang is killed, a death is reaped and named.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "touchstone/runtime/backend.h"
#include "touchstone/runtime/backend_channel.h"
#include "touchstone/runtime/process_tree.h"
#include "touchstone/runtime/stop_signals.h"

namespace touchstone {
namespace {

using Clock = std::chrono::steady_clock;
using protocol::Op;
using protocol::ProtocolError;
using protocol::Reader;
using protocol::Writer;

constexpr uint64_t kMaxErrorReply = 4 + 4 + (1u << 20);

std::string runner_path(const ChildOptions& o) {
  if (!o.runner.empty()) return o.runner;
  if (const char* env = std::getenv("TOUCHSTONE_RUNNER")) return env;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot locate touchstone-backend-runner: /proc/self/exe: {}", ec.message());
  const auto beside = exe.parent_path() / "touchstone-backend-runner";
  // Inside a team's own test binary: the SDK's bin/, beside the lib/ that holds
  // libtouchstone_parity.so.
  if (const auto lib = harness_code_dir(); !std::filesystem::exists(beside) && !lib.empty()) {
    const auto sdk = lib.parent_path() / "bin" / "touchstone-backend-runner";
    if (std::filesystem::exists(sdk)) return sdk.string();
  }
  return beside.string();
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return fmt::format("was killed by signal {} (SIG{}: {})", sig, abbrev ? abbrev : "?",
                       strsignal(sig));
  }
  return fmt::format("stopped with wait status {}", status);
}

// The program of an exec: command: a name with '/' as is, else the first
// executable regular file of that name on $PATH (resolved before fork, so a
// missing program is an error here, not an exit status 127 of the child).
std::string find_program(const std::string& name, const std::string& spec) {
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) != 0) {
      throw Error("backend '{}': '{}' is not executable: {}", spec, name, std::strerror(errno));
    }
    return name;
  }
  const char* env = std::getenv("PATH");
  const std::string path = env ? env : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find(':', start), path.size());
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + name;
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  throw Error("backend '{}': program '{}' not found on PATH", spec, name);
}

class ChildChannel final : public BackendChannel {
 public:
  // `library`: a library path (run by the runner) or an "exec:" command.
  ChildChannel(std::string library, ChildOptions options)
      : library_(std::move(library)),
        exec_(is_exec_backend(library_)),
        options_(std::move(options)) {
    start();
  }
  ~ChildChannel() override { stop(); }

  const BackendInfo& info() const override { return info_; }
  bool alive() const override { return pid_ > 0; }
  void restart() override {
    stop();
    start();
  }

  ts_capabilities capabilities() override {
    auto reply = call(Op::kCapabilities, Writer{}, kMaxErrorReply);
    Reader r(reply, "capabilities reply");
    ok_or_throw(r, "capabilities");
    ts_capabilities c{};
    try {
      c = protocol::decode_capabilities(r, note_, info_.protocol_version);
      r.finish();
    } catch (const ProtocolError& e) {
      violation("capabilities", e.what());
    }
    check_serving_flags(c.flags);
    return c;
  }
  Handle load_model(const std::string& path, int32_t* n_vocab) override {
    Writer w;
    w.str(path);
    auto reply = call(Op::kLoadModel, w, kMaxErrorReply);
    Reader r(reply, "load_model reply");
    ok_or_throw(r, "load_model");
    const Handle h = r.u64("model");
    *n_vocab = r.i32("n_vocab");
    r.finish();
    return h;
  }
  void free_model(Handle m) noexcept override { free_handle(Op::kFreeModel, m); }
  Handle open_session(Handle m, const ts_session_options& o) override {
    Writer w;
    w.u64(m).i32(o.weight_path).i32(o.n_threads).i32(o.max_context).str(o.fault ? o.fault : "");
    auto reply = call(Op::kOpenSession, w, kMaxErrorReply);
    Reader r(reply, "open_session reply");
    ok_or_throw(r, "open_session");
    const Handle h = r.u64("session");
    r.finish();
    return h;
  }
  void free_session(Handle s) noexcept override { free_handle(Op::kFreeSession, s); }
  void prefill(Handle s, std::span<const int32_t> t, bool all, std::span<float> out) override {
    Writer w;
    w.u64(s).i32(all ? 1 : 0).i32(int32_t(t.size())).i32s(t);
    const char* what = all ? "prefill(all positions)" : "prefill";
    const LongCall scaled(*this, t.size());
    floats_call(Op::kPrefill, w, what, out);
  }
  void decode(Handle s, int32_t token, std::span<float> out) override {
    Writer w;
    w.u64(s).i32(token);
    floats_call(Op::kDecode, w, "decode", out);
  }
  int32_t prefill_greedy(Handle s, std::span<const int32_t> t) override {
    if (!info_.device_greedy) {
      throw Error("{}: backend has no device greedy (TS_CAP_DEVICE_GREEDY)", info_.name);
    }
    Writer w;
    w.u64(s).i32(int32_t(t.size())).i32s(t);
    const LongCall scaled(*this, t.size());
    return i32_call(Op::kPrefillGreedy, w, "prefill_greedy", "token");
  }
  void rewind(Handle s, int32_t p) override {
    Writer w;
    w.u64(s).i32(p);
    status_call(Op::kRewind, w, "rewind");
  }
  int32_t position(Handle s) override {
    Writer w;
    w.u64(s);
    return i32_call(Op::kPosition, w, "position", "position");
  }
  void set_taps(Handle s, bool enable) override {
    if (!info_.taps) throw Error("{}: backend has no layer taps (ABI v4)", info_.name);
    Writer w;
    w.u64(s).i32(enable ? 1 : 0);
    status_call(Op::kSetTaps, w, "set_taps");
  }
  void read_taps(Handle s, std::span<float> out) override {
    if (!info_.taps) throw Error("{}: backend has no layer taps (ABI v4)", info_.name);
    Writer w;
    w.u64(s).u64(out.size());
    floats_call(Op::kReadTaps, w, "read_taps", out);
  }
  void step_batch(std::span<const BatchCall> entries) override;
  Handle fork_session(Handle src, int32_t n_prefix) override;
  void set_grammar(Handle s, const ts_grammar* g) override;
  void grammar_mask(Handle s, std::span<uint32_t> out) override;
  void grammar_greedy(Handle s, std::span<int32_t> out) override;
  void prefill_embeddings(Handle s, std::span<const float> e, int32_t n_embd, bool bidirectional,
                          bool all, std::span<float> out) override;
  void load_vision(Handle m, const std::string& path) override;
  void encode_image(Handle m, ts_image_format format, std::span<const uint8_t> data, int32_t height,
                    int32_t width, std::span<float> out) override;
  PixelTensor preprocess_image(Handle m, std::span<const uint8_t> rgb, int32_t height,
                               int32_t width) override;
  void set_vision_options(Handle m, const std::string& fault) override;

 private:
  void check_serving_flags(uint32_t flags);
  // The program to execute (checked, resolved on PATH) and its argv.
  std::pair<std::string, std::vector<std::string>> child_command() const;
  void spawn(const std::string& program, std::vector<std::string> args);
  void start();
  void check_exec_info();
  void stop() noexcept;
  void end_tree() noexcept;
  std::vector<uint8_t> call(Op op, const Writer& w, uint64_t max_reply);
  // The time limit is per call and per 1024 tokens: a prefill of n tokens gets
  // ceil(n / 1024) times call_timeout_s (a 4,449-token long-context prompt on a
  // software Vulkan device is one call of several minutes).
  double time_scale_ = 1.0;
  struct LongCall {
    LongCall(ChildChannel& c, size_t n_tokens) : c_(c) {
      c_.time_scale_ = double(std::max<size_t>(1, (n_tokens + 1023) / 1024));
    }
    ~LongCall() { c_.time_scale_ = 1.0; }
    LongCall(const LongCall&) = delete;
    LongCall& operator=(const LongCall&) = delete;
    ChildChannel& c_;
  };
  double call_limit_s() const { return options_.call_timeout_s * time_scale_; }
  std::string display_name() const { return info_.name.empty() ? library_ : info_.name; }
  void wait_for(short events, Clock::time_point deadline, const char* what);
  void send_all(const std::string& bytes, Clock::time_point deadline, const char* what);
  void recv_exact(uint8_t* dst, size_t n, Clock::time_point deadline, const char* what);
  [[noreturn]] void died(const char* what, const std::string& how);
  [[noreturn]] void violation(const char* what, const std::string& detail);
  void ok_or_throw(Reader& r, const char* what);

  void floats_call(Op op, const Writer& w, const char* what, std::span<float> out) {
    auto reply = call(op, w, std::max<uint64_t>(kMaxErrorReply, 4 + out.size_bytes()));
    Reader r(reply, fmt::format("{} reply", what));
    ok_or_throw(r, what);
    if (r.remaining() != out.size_bytes()) {
      violation(what, fmt::format("{} bytes of logits, expected {} ({} floats)", r.remaining(),
                                  out.size_bytes(), out.size()));
    }
    r.f32s("logits", out);
  }
  // A call whose reply is its status only.
  void status_call(Op op, const Writer& w, const char* what) {
    auto reply = call(op, w, kMaxErrorReply);
    Reader r(reply, fmt::format("{} reply", what));
    ok_or_throw(r, what);
    r.finish();
  }
  int32_t i32_call(Op op, const Writer& w, const char* what, const char* field) {
    auto reply = call(op, w, kMaxErrorReply);
    Reader r(reply, fmt::format("{} reply", what));
    ok_or_throw(r, what);
    const int32_t v = r.i32(field);
    r.finish();
    return v;
  }
  void free_handle(Op op, Handle h) noexcept {
    if (!alive()) return;
    try {
      Writer w;
      w.u64(h);
      call(op, w, kMaxErrorReply);
    } catch (const std::exception&) {
      // A backend that fails to free is reported by the next call (it is dead).
    }
  }

  std::string library_;  // library path, or the "exec:" command
  bool exec_ = false;
  ChildOptions options_;
  BackendInfo info_;
  std::string note_;  // capabilities' determinism_note storage
  pid_t pid_ = -1;
  int fd_ = -1;
  proc::Cgroup cgroup_;  // the backend process's, where the host allows one
  int slot_ = -1;        // in the stop-signal handlers' table
};

// ABI v6: every entry's logits in one reply, concatenated in entry order; the
// size must be exactly the sum of the buffers (else a protocol violation).
void ChildChannel::step_batch(std::span<const BatchCall> entries) {
  if (!info_.step_batch) BackendChannel::step_batch(entries);
  std::vector<protocol::BatchEntry> req;
  size_t floats = 0, tokens = 0;
  for (const BatchCall& e : entries) {
    req.push_back({e.session, e.all_positions, e.tokens});
    floats += e.out.size();
    tokens += e.tokens.size();
  }
  Writer w;
  protocol::encode_step_batch(w, req);
  const LongCall scaled(*this, tokens);
  auto reply =
      call(Op::kStepBatch, w, std::max<uint64_t>(kMaxErrorReply, 4 + floats * sizeof(float)));
  Reader r(reply, "step_batch reply");
  ok_or_throw(r, "step_batch");
  if (r.remaining() != floats * sizeof(float)) {
    violation("step_batch",
              fmt::format("{} bytes of logits, expected {} ({} floats for {} entries)",
                          r.remaining(), floats * sizeof(float), floats, entries.size()));
  }
  for (const BatchCall& e : entries) r.f32s("logits", e.out);
}

Handle ChildChannel::fork_session(Handle src, int32_t n_prefix) {
  if (!info_.fork) return BackendChannel::fork_session(src, n_prefix);
  Writer w;
  protocol::encode(w, protocol::ForkRequest{src, n_prefix});
  auto reply = call(Op::kForkSession, w, kMaxErrorReply);
  Reader r(reply, "fork_session reply");
  ok_or_throw(r, "fork_session");
  Handle h = 0;
  try {
    h = r.u64("session");
    r.finish();
  } catch (const ProtocolError& e) {
    violation("fork_session", e.what());
  }
  return h;
}

// ABI v7: a status-only set_grammar; the mask and the picks are fixed-size replies.
void ChildChannel::set_grammar(Handle s, const ts_grammar* g) {
  if (!info_.grammar) BackendChannel::set_grammar(s, g);
  Writer w;
  w.u64(s).i32(g ? int32_t(g->kind) : -1).str(g && g->text ? g->text : "");
  status_call(Op::kSetGrammar, w, "set_grammar");
}

void ChildChannel::grammar_mask(Handle s, std::span<uint32_t> out) {
  if (!info_.grammar) BackendChannel::grammar_mask(s, out);
  Writer w;
  w.u64(s).i32(int32_t(out.size()));
  auto reply = call(Op::kGrammarMask, w, std::max<uint64_t>(kMaxErrorReply, 4 + out.size_bytes()));
  Reader r(reply, "grammar_mask reply");
  ok_or_throw(r, "grammar_mask");
  if (r.remaining() != out.size_bytes())
    violation("grammar_mask",
              fmt::format("{} bytes, expected {}", r.remaining(), out.size_bytes()));
  for (uint32_t& word : out) word = r.u32("mask");
}

void ChildChannel::grammar_greedy(Handle s, std::span<int32_t> out) {
  if (!info_.grammar) BackendChannel::grammar_greedy(s, out);
  Writer w;
  w.u64(s).i32(int32_t(out.size()));
  auto reply =
      call(Op::kGrammarGreedy, w, std::max<uint64_t>(kMaxErrorReply, 4 + out.size_bytes()));
  Reader r(reply, "grammar_greedy reply");
  ok_or_throw(r, "grammar_greedy");
  if (r.remaining() != out.size_bytes())
    violation("grammar_greedy",
              fmt::format("{} bytes, expected {}", r.remaining(), out.size_bytes()));
  r.i32s("tokens", out);
}

// ABI v8: the embeddings and pixels go in the request; the replies are fixed-size floats.
void ChildChannel::prefill_embeddings(Handle s, std::span<const float> e, int32_t n_embd,
                                      bool bidirectional, bool all, std::span<float> out) {
  if (!info_.embeddings) BackendChannel::prefill_embeddings(s, e, n_embd, bidirectional, all, out);
  const int32_t n = n_embd > 0 ? int32_t(e.size() / size_t(n_embd)) : 0;
  Writer w;
  w.u64(s).i32(all ? 1 : 0).i32(n).i32(n_embd).i32(bidirectional ? 1 : 0).f32s(e);
  const LongCall scaled(*this, size_t(n));
  floats_call(Op::kPrefillEmbeddings, w, "prefill_embeddings", out);
}

void ChildChannel::load_vision(Handle m, const std::string& path) {
  if (!info_.vision) BackendChannel::load_vision(m, path);
  Writer w;
  w.u64(m).str(path);
  status_call(Op::kLoadVision, w, "load_vision");
}

void ChildChannel::encode_image(Handle m, ts_image_format format, std::span<const uint8_t> data,
                                int32_t height, int32_t width, std::span<float> out) {
  if (!info_.vision) BackendChannel::encode_image(m, format, data, height, width, out);
  check_image_bytes(format, data.size(), height, width);
  Writer w;
  w.u64(m).i32(int32_t(format)).i32(3).i32(height).i32(width).u64(out.size()).u8s(data);
  floats_call(Op::kEncodeImage, w, "encode_image", out);
}

// ABI v9: the reply carries the shape, then the tensor (at most 2^28 floats).
PixelTensor ChildChannel::preprocess_image(Handle m, std::span<const uint8_t> rgb, int32_t height,
                                           int32_t width) {
  if (!info_.preprocess) return BackendChannel::preprocess_image(m, rgb, height, width);
  check_image_bytes(TS_IMAGE_RGB8, rgb.size(), height, width);
  Writer w;
  w.u64(m).i32(3).i32(height).i32(width).u8s(rgb);
  auto reply = call(Op::kPreprocessImage, w, kMaxErrorReply + 16 + (uint64_t{1} << 30));
  Reader r(reply, "preprocess_image reply");
  ok_or_throw(r, "preprocess_image");
  PixelTensor t;
  t.n_frames = r.i32("n_frames");
  t.channels = r.i32("channels");
  t.height = r.i32("height");
  t.width = r.i32("width");
  size_t n = 0;
  try {
    n = pixel_tensor_size(t, "preprocess_image");
  } catch (const Error& e) {
    violation("preprocess_image", e.what());
  }
  if (r.remaining() != n * sizeof(float))
    violation("preprocess_image", fmt::format("{} bytes of pixels, expected {} ({} floats)",
                                              r.remaining(), n * sizeof(float), n));
  t.values.resize(n);
  r.f32s("pixels", t.values);
  return t;
}

void ChildChannel::set_vision_options(Handle m, const std::string& fault) {
  if (!info_.vision_options) BackendChannel::set_vision_options(m, fault);
  Writer w;
  w.u64(m).str(fault);
  status_call(Op::kSetVisionOptions, w, "set_vision_options");
}

// A capability flag of ABI v6 that claims a call the hello said is missing is a
// table the loader would refuse.
void ChildChannel::check_serving_flags(uint32_t flags) {
  if ((flags & TS_CAP_BATCHED_SESSIONS) && !info_.step_batch)
    violation("capabilities", "TS_CAP_BATCHED_SESSIONS claimed without step_batch");
  if ((flags & TS_CAP_KV_PREFIX_COPY) && !info_.fork)
    violation("capabilities", "TS_CAP_KV_PREFIX_COPY claimed without fork_session");
  if ((flags & TS_CAP_STRUCTURED_OUTPUT) && !info_.grammar)
    violation("capabilities", "TS_CAP_STRUCTURED_OUTPUT claimed without set_grammar");
  if ((flags & TS_CAP_EMBEDDING_INPUT) && !info_.embeddings)
    violation("capabilities", "TS_CAP_EMBEDDING_INPUT claimed without prefill_embeddings");
  if ((flags & TS_CAP_MULTIMODAL) && !info_.vision)
    violation("capabilities", "TS_CAP_MULTIMODAL claimed without load_vision");
}

// The child: the runner for a library, the command itself for "exec:" (argv[0]
// as written, the program resolved on PATH).
std::pair<std::string, std::vector<std::string>> ChildChannel::child_command() const {
  if (!exec_) {
    const std::string runner = runner_path(options_);
    if (::access(runner.c_str(), X_OK) != 0) {
      throw Error("backend runner '{}' is not executable: {}", runner, std::strerror(errno));
    }
    return {runner, {runner, "--fd", "3", library_}};
  }
  std::vector<std::string> argv = exec_command(library_);
  return {find_program(argv[0], library_), argv};
}

void ChildChannel::start() {
  const auto [program, argv] = child_command();
  spawn(program, argv);
  Writer w;
  w.u32(protocol::kVersion);
  auto reply = call(Op::kHello, w, 4 + 4 + (1u << 20) + (1u << 18));
  Reader r(reply, "hello reply");
  try {
    const int32_t status = r.i32("status");
    if (status != TS_OK) {
      // The runner could not load the library (the loader's own message), or
      // an exec: child could not start its engine (its message).
      const std::string msg = r.str("error");
      stop();
      throw Error("{}", msg);
    }
    info_ = protocol::decode_info(r);
    r.finish();
  } catch (const ProtocolError& e) {
    violation("hello", e.what());
  }
  if (info_.protocol_version < protocol::kMinVersion ||
      info_.protocol_version > protocol::kVersion) {
    violation("hello",
              fmt::format("the backend process speaks protocol version {}, the harness {}..{}",
                          info_.protocol_version, protocol::kMinVersion, protocol::kVersion));
  }
  if (exec_) check_exec_info();
}

// An exec: child is not checked by the loader: its table must still be one the
// loader would accept. Its path is the command line the harness ran.
void ChildChannel::check_exec_info() {
  const uint32_t v = info_.api_version;
  std::string bad;
  if (v < 1 || v > TS_BACKEND_API_VERSION) {
    bad = fmt::format("api_version {}, this harness supports 1..{}", v, TS_BACKEND_API_VERSION);
  } else if (info_.device_greedy && v < 2) {
    bad = fmt::format("device greedy claimed by an api_version {} backend (needs 2)", v);
  } else if (info_.declares_models && v < 3) {
    bad = fmt::format("architectures declared by an api_version {} backend (needs 3)", v);
  } else if (info_.taps && v < 4) {
    bad = fmt::format("layer taps claimed by an api_version {} backend (needs 4)", v);
  } else if ((info_.step_batch || info_.fork) && v < 6) {
    bad =
        fmt::format("step_batch / fork_session claimed by an api_version {} backend (needs 6)", v);
  } else if (info_.grammar && v < 7) {
    bad = fmt::format("set_grammar claimed by an api_version {} backend (needs 7)", v);
  } else if ((info_.embeddings || info_.vision) && v < 8) {
    bad = fmt::format("multimodal calls claimed by an api_version {} backend (needs 8)", v);
  } else if ((info_.preprocess || info_.vision_options) && (v < 9 || !info_.vision)) {
    bad = fmt::format(
        "preprocess_image / set_vision_options claimed by an api_version {} backend{} (needs 9 "
        "and load_vision)",
        v, info_.vision ? "" : " without load_vision");
  } else if (info_.name.empty()) {
    bad = "empty backend name";
  }
  if (!bad.empty()) violation("hello", bad);
  info_.path.clear();
  for (const std::string& a : exec_command(library_))
    info_.path += (info_.path.empty() ? "" : " ") + a;
}

void ChildChannel::spawn(const std::string& program, std::vector<std::string> args) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    throw Error("socketpair for the backend process: {}", std::strerror(errno));
  }
  // An exec: child reads nothing from the harness's stdin; a stdio: child gets
  // the socket as stdin and stdout instead of fd 3.
  const bool stdio = is_stdio_backend(library_);
  const int null_in = exec_ && !stdio ? ::open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
  // argv is built before fork: the child only calls async-signal-safe functions.
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Orphans of the backend's process (a grandchild that calls setsid()) are
  // handed to this process instead of init, so that end_tree finds them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  proc::install_harness_stop_handlers();
  cgroup_ = proc::cgroup_create();  // inactive where the host does not allow it
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(sv[0]);
    ::close(sv[1]);
    if (null_in >= 0) ::close(null_in);
    proc::cgroup_remove(cgroup_, 0);
    throw Error("fork for the backend process: {}", std::strerror(e));
  }
  if (pid == 0) {
    // Die with the harness; the backend's stdout goes to stderr so it cannot
    // garble the report on stdout; the socket becomes fd 3 (without CLOEXEC);
    // fds 4 and up are closed.
    proc::reset_stop_handlers();
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);                          // a group of its own: end_tree ends what it starts
    proc::cgroup_enter(cgroup_, ::getpid());  // before it can start anything
    if (stdio) {
      if (::dup2(sv[1], 0) != 0 || ::dup2(sv[1], 1) != 1) ::_exit(127);
      if (::close_range(3, ~0u, 0) != 0) {
        for (int fd = 3; fd < 4096; ++fd) ::close(fd);
      }
      ::execv(program.c_str(), argv.data());
      ::_exit(127);
    }
    ::dup2(2, 1);
    if (null_in >= 0) ::dup2(null_in, 0);
    if (sv[1] == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else if (::dup2(sv[1], 3) != 3) {
      ::_exit(127);
    }
    // Nothing else of the harness's (report files, the model's mapping) leaks
    // into the child, close-on-exec or not.
    if (::close_range(4, ~0u, 0) != 0) {
      for (int fd = 4; fd < 4096; ++fd) ::close(fd);
    }
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // as the child does, whichever runs first
  if (cgroup_.active() && !proc::cgroup_enter(cgroup_, pid)) proc::cgroup_remove(cgroup_, 0);
  slot_ = proc::track_child(pid, cgroup_);
  ::close(sv[1]);
  if (null_in >= 0) ::close(null_in);
  pid_ = pid;
  fd_ = sv[0];
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

// Ends what the backend process left behind once it is reaped: its cgroup
// (every process in it), its process group (the child leads one) and, since
// the harness is a child subreaper (spawn), every descendant left, orphans that
// moved to a group or session of their own included, scan after scan
// (touchstone/runtime/process_tree.h). Other channels' live processes are spared.
void ChildChannel::end_tree() noexcept {
  proc::cgroup_kill(cgroup_);
  if (pid_ > 0) ::kill(-pid_, SIGKILL);
  pid_t spare[64];
  const int n_spare = proc::tracked_pids(pid_, spare, 64);
  proc::kill_descendants(spare, n_spare, 3000);
  proc::cgroup_remove(cgroup_, 1000);
  proc::untrack_child(slot_);
  slot_ = -1;
}

void ChildChannel::stop() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (pid_ <= 0) return;
  // Closing the socket asks the runner to exit; give it a moment, then kill.
  int status = 0;
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      end_tree();
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &status, 0);
  end_tree();
  pid_ = -1;
}

void ChildChannel::died(const char* what, const std::string& how) {
  // The runner closed the socket or failed: reap it (kill it if it lingers).
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::string cause = how;
  if (pid_ > 0) {
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 100 && got == 0; ++i) {
      got = ::waitpid(pid_, &status, WNOHANG);
      if (got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (got == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      cause += "; it did not exit and was killed";
    } else if (got == pid_) {
      cause = "the backend process " + describe_wait_status(status);
    }
    end_tree();
    pid_ = -1;
  }
  throw BackendCrash(fmt::format("backend '{}': {} during {}", display_name(), cause, what));
}

void ChildChannel::violation(const char* what, const std::string& detail) {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    end_tree();
    pid_ = -1;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  throw BackendCrash(fmt::format("backend '{}': protocol violation in {}: {} (process killed)",
                                 display_name(), what, detail));
}

void ChildChannel::wait_for(short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      end_tree();
      pid_ = -1;
      ::close(fd_);
      fd_ = -1;
      throw BackendCrash(fmt::format("backend '{}': timed out after {} s in {} (process killed)",
                                     display_name(), call_limit_s(), what));
    }
    pollfd p{fd_, events, 0};
    const int pr = ::poll(&p, 1, int(std::min<int64_t>(left.count(), 1000)));
    if (pr > 0) return;  // ready, or POLLHUP/POLLERR: the next send/recv tells
    if (pr < 0 && errno != EINTR) died(what, fmt::format("poll failed ({})", std::strerror(errno)));
  }
}

void ChildChannel::send_all(const std::string& bytes, Clock::time_point deadline,
                            const char* what) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += size_t(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      wait_for(POLLOUT, deadline, what);
    } else if (!(n < 0 && errno == EINTR)) {
      died(what, fmt::format("sending the request failed ({})", std::strerror(errno)));
    }
  }
}

void ChildChannel::recv_exact(uint8_t* dst, size_t n, Clock::time_point deadline,
                              const char* what) {
  size_t off = 0;
  while (off < n) {
    const ssize_t got = ::recv(fd_, dst + off, n - off, 0);
    if (got > 0) {
      off += size_t(got);
    } else if (got == 0) {
      died(what, "the backend process closed the connection");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      wait_for(POLLIN, deadline, what);
    } else if (errno != EINTR) {
      died(what, fmt::format("reading the reply failed ({})", std::strerror(errno)));
    }
  }
}

std::vector<uint8_t> ChildChannel::call(Op op, const Writer& w, uint64_t max_reply) {
  const char* what = protocol::op_name(uint32_t(op));
  if (!alive()) {
    throw BackendCrash(
        fmt::format("backend '{}': {}: the backend process is not running", display_name(), what));
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(call_limit_s()));
  send_all(protocol::frame(uint32_t(op), w.bytes()), deadline, what);
  uint8_t header[protocol::kHeaderSize];
  recv_exact(header, sizeof header, deadline, what);
  protocol::FrameHeader h;
  try {
    h = protocol::parse_header(header, max_reply);
  } catch (const ProtocolError& e) {
    violation(what, e.what());
  }
  if (h.op != (uint32_t(op) | protocol::kReplyBit)) {
    violation(what, fmt::format("reply op 0x{:x}, expected 0x{:x}", h.op,
                                uint32_t(op) | protocol::kReplyBit));
  }
  std::vector<uint8_t> payload(size_t(h.payload_len));
  recv_exact(payload.data(), payload.size(), deadline, what);
  return payload;
}

void ChildChannel::ok_or_throw(Reader& r, const char* what) {
  int32_t status = 0;
  std::string msg;
  try {
    status = r.i32("status");
    if (status == TS_OK) return;
    msg = r.str("error");
    r.finish();
  } catch (const ProtocolError& e) {
    violation(what, e.what());
  }
  if (status == protocol::kStatusContractViolation) {
    violation(what, msg);
  }
  if (status < TS_OK || status > TS_ERR_INTERNAL) {
    violation(what, fmt::format("unknown status {}", status));
  }
  throw BackendError(ts_status(status), fmt::format("backend '{}': {}: {}: {}", info_.name, what,
                                                    status_name(ts_status(status)),
                                                    msg.empty() ? "(no message)" : msg));
}

}  // namespace

std::unique_ptr<BackendChannel> open_child_process(const std::string& name_or_path,
                                                   const ChildOptions& options) {
  if (!(options.call_timeout_s > 0)) {
    throw Error("backend call time limit must be > 0 s, got {}", options.call_timeout_s);
  }
  return std::make_unique<ChildChannel>(resolve_backend_path(name_or_path), options);
}

}  // namespace touchstone
