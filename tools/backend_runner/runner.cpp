// touchstone-backend-runner --fd N LIBRARY
// touchstone-backend-runner --stdio LIBRARY
//
// The child side of the child-process protocol (touchstone/runtime/protocol.h,
// docs/protocol.md): loads one backend library in this process, then answers
// requests on fd N (or: reads them on stdin and answers on stdout, for a
// harness on another machine, `--backend "stdio:ssh HOST
// touchstone-backend-runner --stdio LIB"`, docs/remote-backends.md) until the
// harness closes it. Whatever the backend does to
// this process (crash, exit, hang, heap overflow) the harness sees as this
// process dying or going silent, and reports it; the runner itself only
// forwards calls, checks handles, and guards every logits buffer with a
// sentinel tail so a backend writing past n_vocab floats is caught
// (kStatusContractViolation) instead of silently corrupting memory.
#include <fcntl.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "touchstone/runtime/backend.h"
#include "touchstone/runtime/backend_channel.h"
#include "touchstone/runtime/protocol.h"
#include "touchstone/runtime/stop_signals.h"

namespace touchstone {
namespace {

using protocol::Op;
using protocol::Reader;
using protocol::Writer;

constexpr size_t kGuardFloats = 4096;
constexpr uint32_t kGuardBits = 0x7fc0dead;  // a NaN payload no kernel produces by accident

// Exits at once, ending first what the backend started.
[[noreturn]] void quit(int rc) {
  proc::end_runner_descendants();
  std::_Exit(rc);
}

bool read_exact(int fd, uint8_t* dst, size_t n) {
  size_t off = 0;
  while (off < n) {
    const ssize_t got = ::read(fd, dst + off, n - off);
    if (got > 0) {
      off += size_t(got);
    } else if (got == 0 || errno != EINTR) {
      return false;
    }
  }
  return true;
}

// A socket (--fd) or a pipe / ssh channel (--stdio); SIGPIPE is ignored.
void write_all(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n > 0) {
      off += size_t(n);
    } else if (!(n < 0 && errno == EINTR)) {
      quit(3);  // the harness is gone
    }
  }
}

// A status reply for an error.
std::string error_payload(int32_t status, const std::string& msg) {
  Writer w;
  w.i32(status).str(msg);
  return w.bytes();
}

class Runner {
 public:
  // `version`: the protocol version agreed in the hello.
  Runner(std::unique_ptr<BackendChannel> ch, uint32_t version)
      : ch_(std::move(ch)), version_(version) {}
  // Answers one request; `payload` is the request body.
  std::string handle(Op op, Reader& r);
  bool poisoned() const { return poisoned_; }

 private:
  std::vector<float>& guarded(size_t n);
  void check_guard(size_t n, const char* what);
  void check_guard_at(size_t begin, size_t end, size_t n, const char* what);
  std::string step_batch(Reader& r);
  void check_batch_size(const std::vector<protocol::DecodedBatchEntry>& req);
  std::string fork_session(Reader& r);
  std::string set_grammar(Reader& r);
  std::string grammar_mask(Reader& r);
  std::string grammar_greedy(Reader& r);
  std::string prefill_embeddings(Reader& r);
  std::string load_vision(Reader& r);
  std::string encode_image(Reader& r);
  std::string preprocess_image(Reader& r);
  std::string set_vision_options(Reader& r);
  // The other ops with arguments beyond a handle, each answering TS_OK + its result.
  std::string load_model(Reader& r);
  std::string open_session(Reader& r);
  std::string prefill(Reader& r);
  std::string prefill_greedy(Reader& r);
  std::string read_taps(Reader& r);
  // ABI v6/v7 members are called only when the table has them (non-NULL) and
  // the protocol agreed carries them.
  void need(bool has, const char* member, uint32_t protocol = 4, int abi = 6) const {
    if (!has || version_ < protocol) {
      throw BackendError(TS_ERR_UNSUPPORTED, fmt::format("backend '{}' has no {} (ABI v{})",
                                                         ch_->info().name, member, abi));
    }
  }
  Handle model(Reader& r) {
    const Handle h = r.u64("model");
    if (!models_.count(h)) throw Error("runner: unknown model handle {}", h);
    return h;
  }
  Handle session(Reader& r) {
    const Handle h = r.u64("session");
    if (!sessions_.count(h)) throw Error("runner: unknown session handle {}", h);
    return h;
  }
  std::string floats_reply(size_t n) {
    Writer w;
    w.i32(TS_OK).f32s(std::span<const float>(buf_.data(), n));
    return w.bytes();
  }

  std::unique_ptr<BackendChannel> ch_;
  uint32_t version_;
  std::map<Handle, int32_t> models_;    // -> n_vocab
  std::map<Handle, int32_t> sessions_;  // -> n_vocab
  std::vector<float> buf_;
  bool poisoned_ = false;
};

std::vector<float>& Runner::guarded(size_t n) {
  buf_.assign(n + kGuardFloats, 0.0f);
  float guard;
  std::memcpy(&guard, &kGuardBits, sizeof guard);
  std::fill(buf_.begin() + std::ptrdiff_t(n), buf_.end(), guard);
  return buf_;
}

void Runner::check_guard(size_t n, const char* what) { check_guard_at(n, buf_.size(), n, what); }

// buf_[begin, end) must still hold the sentinel: what wrote there went past the
// end of a buffer of n floats.
void Runner::check_guard_at(size_t begin, size_t end, size_t n, const char* what) {
  for (size_t i = begin; i < end; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &buf_[i], sizeof bits);
    if (bits != kGuardBits) {
      poisoned_ = true;
      throw protocol::ProtocolError(
          "{} wrote past the end of its logits buffer: the buffer holds {} floats (n_vocab x "
          "positions), float {} was changed",
          what, n, i - (begin - n));
    }
  }
}

// The floats of a logits reply of `rows` rows of n_vocab after `before` floats
// already planned: a request asking for more than kMaxLogitsReply bytes is
// refused before anything is allocated.
size_t reply_floats(size_t n_vocab, size_t rows, size_t before, const char* what) {
  constexpr size_t kMax = protocol::kMaxLogitsReply / sizeof(float);
  if (rows > kMax / std::max<size_t>(n_vocab, 1) || before + rows * n_vocab > kMax) {
    throw BackendError(
        TS_ERR_INVALID_ARGUMENT,
        fmt::format("runner: {}: {} rows of {} logits would need more than the {} bytes a "
                    "logits reply may carry",
                    what, rows, n_vocab, protocol::kMaxLogitsReply));
  }
  return rows * n_vocab;
}

// At most the backend's max_batch entries (when it has one), checked before
// any buffer is sized for them.
void Runner::check_batch_size(const std::vector<protocol::DecodedBatchEntry>& req) {
  const int32_t max_batch = ch_->capabilities().max_batch;
  if (max_batch > 0 && req.size() > size_t(max_batch)) {
    throw BackendError(TS_ERR_INVALID_ARGUMENT,
                       fmt::format("runner: step_batch: {} entries, more than the backend's "
                                   "max_batch ({})",
                                   req.size(), max_batch));
  }
}

// Every entry's logits get their own region of buf_, each followed by a
// sentinel tail of kGuardFloats, so a backend writing past one entry's buffer
// is caught, as for prefill.
std::string Runner::step_batch(Reader& r) {
  need(ch_->info().step_batch, "step_batch");
  const std::vector<protocol::DecodedBatchEntry> req = protocol::decode_step_batch(r);
  check_batch_size(req);
  std::vector<size_t> offset(req.size() + 1, 0);
  std::set<Handle> seen;
  for (size_t i = 0; i < req.size(); ++i) {
    if (!sessions_.count(req[i].session))
      throw Error("runner: step_batch: entry {}: unknown session handle {}", i, req[i].session);
    if (!seen.insert(req[i].session).second) {
      throw BackendError(TS_ERR_INVALID_ARGUMENT,
                         fmt::format("runner: step_batch: entry {} repeats the session of an "
                                     "earlier entry (every entry's session must be distinct)",
                                     i));
    }
    const size_t n = reply_floats(size_t(sessions_[req[i].session]),
                                  req[i].all_positions ? req[i].tokens.size() : size_t(1),
                                  offset[i], "step_batch");
    offset[i + 1] = offset[i] + n + kGuardFloats;
  }
  float guard;
  std::memcpy(&guard, &kGuardBits, sizeof guard);
  buf_.assign(offset.back(), guard);
  std::vector<BatchCall> calls(req.size());
  for (size_t i = 0; i < req.size(); ++i) {
    const size_t n = offset[i + 1] - offset[i] - kGuardFloats;
    std::fill_n(buf_.begin() + std::ptrdiff_t(offset[i]), n, 0.0f);
    calls[i] = {req[i].session, req[i].tokens, req[i].all_positions,
                std::span<float>(buf_.data() + offset[i], n)};
  }
  ch_->step_batch(calls);
  Writer w;
  w.i32(TS_OK);
  for (size_t i = 0; i < req.size(); ++i) {
    const size_t n = calls[i].out.size();
    const std::string what = fmt::format("step_batch (entry {})", i);
    check_guard_at(offset[i] + n, offset[i + 1], n, what.c_str());
    w.f32s(calls[i].out);
  }
  return w.bytes();
}

std::string Runner::fork_session(Reader& r) {
  need(ch_->info().fork, "fork_session");
  const protocol::ForkRequest f = protocol::decode_fork(r);
  if (!sessions_.count(f.session))
    throw Error("runner: fork_session: unknown session handle {}", f.session);
  const Handle h = ch_->fork_session(f.session, f.n_prefix);
  if (h == 0 || sessions_.count(h) || models_.count(h)) {
    // TS_OK with no session, or with one that already exists: the backend broke
    // the contract and its state can no longer be trusted.
    poisoned_ = true;
    throw protocol::ProtocolError("fork_session returned TS_OK with {} session handle 0x{:x}",
                                  h == 0 ? "a NULL" : "an already open", h);
  }
  sessions_[h] = sessions_[f.session];
  Writer w;
  w.i32(TS_OK).u64(h);
  return w.bytes();
}

std::string Runner::set_grammar(Reader& r) {
  need(ch_->info().grammar, "set_grammar", 5, 7);
  const Handle s = session(r);
  const int32_t kind = r.i32("kind");
  const std::string text = r.str("text", 16u << 20);
  r.finish();
  if (kind < 0) {
    ch_->set_grammar(s, nullptr);
  } else {
    ts_grammar g{};
    g.struct_size = sizeof g;
    g.kind = static_cast<ts_grammar_kind>(kind);
    g.text = text.c_str();
    ch_->set_grammar(s, &g);
  }
  Writer w;
  w.i32(TS_OK);
  return w.bytes();
}

// The mask and the picks are sized by the request, bounded before allocation.
std::string Runner::grammar_mask(Reader& r) {
  need(ch_->info().grammar, "grammar_mask", 5, 7);
  const Handle s = session(r);
  const int32_t n = r.i32("n_words");
  r.finish();
  if (n < 1 || n > (1 << 24)) throw Error("runner: grammar_mask: n_words {} outside [1, 2^24]", n);
  std::vector<uint32_t> mask(size_t(n), 0);
  ch_->grammar_mask(s, mask);
  Writer w;
  w.i32(TS_OK);
  for (uint32_t word : mask) w.u32(word);
  return w.bytes();
}

std::string Runner::grammar_greedy(Reader& r) {
  need(ch_->info().grammar, "grammar_greedy", 5, 7);
  const Handle s = session(r);
  const int32_t n = r.i32("n_positions");
  r.finish();
  if (n < 1 || n > (1 << 20))
    throw Error("runner: grammar_greedy: n_positions {} outside [1, 2^20]", n);
  std::vector<int32_t> tokens(size_t(n), -1);
  ch_->grammar_greedy(s, tokens);
  Writer w;
  w.i32(TS_OK).i32s(tokens);
  return w.bytes();
}

std::string Runner::load_model(Reader& r) {
  const std::string path = r.str("path");
  r.finish();
  int32_t n_vocab = 0;
  const Handle h = ch_->load_model(path, &n_vocab);
  models_[h] = n_vocab;
  Writer w;
  w.i32(TS_OK).u64(h).i32(n_vocab);
  return w.bytes();
}

std::string Runner::open_session(Reader& r) {
  const Handle m = model(r);
  ts_session_options o{};
  o.struct_size = sizeof o;
  o.weight_path = ts_weight_path(r.i32("weight_path"));
  o.n_threads = r.i32("n_threads");
  o.max_context = r.i32("max_context");
  const std::string fault = r.str("fault");
  r.finish();
  o.fault = fault.empty() ? nullptr : fault.c_str();
  const Handle s = ch_->open_session(m, o);
  sessions_[s] = models_[m];
  Writer w;
  w.i32(TS_OK).u64(s);
  return w.bytes();
}

// The tokens of a prefill request: n_tokens, then exactly that many ids.
std::vector<int32_t> request_tokens(Reader& r, const char* op) {
  const int32_t n = r.i32("n_tokens");
  if (n < 0 || size_t(n) * 4 != r.remaining()) {
    throw Error("runner: {}: n_tokens {} does not match the {} bytes of tokens", op, n,
                r.remaining());
  }
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  r.i32s("tokens", tokens);
  return tokens;
}

std::string Runner::prefill(Reader& r) {
  const Handle s = session(r);
  const bool all = r.i32("all_positions") != 0;
  const std::vector<int32_t> tokens = request_tokens(r, "prefill");
  const size_t out = reply_floats(size_t(sessions_[s]), all ? tokens.size() : 1, 0, "prefill");
  ch_->prefill(s, tokens, all, std::span<float>(guarded(out).data(), out));
  check_guard(out, all ? "prefill(all positions)" : "prefill");
  return floats_reply(out);
}

// ABI v8: the sizes are bounded by the bytes that came before anything is allocated.
std::string Runner::prefill_embeddings(Reader& r) {
  need(ch_->info().embeddings, "prefill_embeddings", 6, 8);
  const Handle s = session(r);
  const bool all = r.i32("all_positions") != 0;
  const int32_t n = r.i32("n");
  const int32_t n_embd = r.i32("n_embd");
  const bool bidirectional = r.i32("bidirectional") != 0;
  if (n < 1 || n_embd < 1 || uint64_t(n) * uint64_t(n_embd) * 4 != r.remaining())
    throw Error("runner: prefill_embeddings: n {} x n_embd {} floats, {} bytes sent", n, n_embd,
                r.remaining());
  std::vector<float> e(size_t(n) * size_t(n_embd));
  r.f32s("embeddings", e);
  r.finish();
  const size_t out =
      reply_floats(size_t(sessions_[s]), all ? size_t(n) : 1, 0, "prefill_embeddings");
  ch_->prefill_embeddings(s, e, n_embd, bidirectional, all,
                          std::span<float>(guarded(out).data(), out));
  check_guard(out, "prefill_embeddings");
  return floats_reply(out);
}

std::string Runner::load_vision(Reader& r) {
  need(ch_->info().vision, "load_vision", 6, 8);
  const Handle m = model(r);
  const std::string path = r.str("path", 1u << 16);
  r.finish();
  ch_->load_vision(m, path);
  Writer w;
  w.i32(TS_OK);
  return w.bytes();
}

std::string Runner::encode_image(Reader& r) {
  need(ch_->info().vision, "encode_image", 6, 8);
  const Handle m = model(r);
  const int32_t format = r.i32("format");
  const int32_t c = r.i32("channels"), h = r.i32("height"), wd = r.i32("width");
  const uint64_t n = r.u64("n_floats");
  const uint64_t per = format == TS_IMAGE_PIXELS_F32 ? 4 : 1;
  if ((format != TS_IMAGE_PIXELS_F32 && format != TS_IMAGE_RGB8) || c != 3 || h < 1 || wd < 1 ||
      uint64_t(c) * uint64_t(h) * uint64_t(wd) * per != r.remaining())
    throw Error("runner: encode_image: format {}, {} x {} x {}, {} bytes sent", format, c, h, wd,
                r.remaining());
  if (n == 0 || n > (uint64_t{1} << 28))
    throw Error("runner: encode_image: n_floats {} outside [1, 2^28]", n);
  std::vector<uint8_t> data(r.remaining());
  r.u8s("image", data);
  r.finish();
  ch_->encode_image(m, ts_image_format(format), data, h, wd,
                    std::span<float>(guarded(size_t(n)).data(), size_t(n)));
  check_guard(size_t(n), "encode_image");
  return floats_reply(size_t(n));
}

std::string Runner::preprocess_image(Reader& r) {
  need(ch_->info().preprocess, "preprocess_image", 7, 9);
  const Handle m = model(r);
  const int32_t c = r.i32("channels"), h = r.i32("height"), wd = r.i32("width");
  if (c != 3 || h < 1 || wd < 1 || uint64_t(c) * uint64_t(h) * uint64_t(wd) != r.remaining())
    throw Error("runner: preprocess_image: {} x {} x {}, {} bytes sent", c, h, wd, r.remaining());
  std::vector<uint8_t> data(r.remaining());
  r.u8s("image", data);
  r.finish();
  const PixelTensor t = ch_->preprocess_image(m, data, h, wd);
  Writer w;
  w.i32(TS_OK).i32(t.n_frames).i32(t.channels).i32(t.height).i32(t.width).f32s(t.values);
  return w.bytes();
}

std::string Runner::set_vision_options(Reader& r) {
  need(ch_->info().vision_options, "set_vision_options", 7, 9);
  const Handle m = model(r);
  const std::string fault = r.str("fault", 4096);
  r.finish();
  ch_->set_vision_options(m, fault);
  Writer w;
  w.i32(TS_OK);
  return w.bytes();
}

std::string Runner::prefill_greedy(Reader& r) {
  const Handle s = session(r);
  const std::vector<int32_t> tokens = request_tokens(r, "prefill_greedy");
  Writer w;
  w.i32(TS_OK).i32(ch_->prefill_greedy(s, tokens));
  return w.bytes();
}

std::string Runner::read_taps(Reader& r) {
  const Handle s = session(r);
  const uint64_t n = r.u64("n_floats");
  r.finish();
  if (n == 0 || n > (uint64_t{1} << 28)) {
    throw Error("runner: read_taps: n_floats {} outside [1, 2^28]", n);
  }
  ch_->read_taps(s, std::span<float>(guarded(size_t(n)).data(), size_t(n)));
  check_guard(size_t(n), "read_taps");
  return floats_reply(size_t(n));
}

std::string Runner::handle(Op op, Reader& r) {
  Writer w;
  w.i32(TS_OK);
  switch (op) {
    case Op::kCapabilities:
      r.finish();
      protocol::encode(w, ch_->capabilities(), version_);
      return w.bytes();
    case Op::kLoadModel:
      return load_model(r);
    case Op::kFreeModel: {
      const Handle h = model(r);
      r.finish();
      ch_->free_model(h);
      models_.erase(h);
      return w.bytes();
    }
    case Op::kOpenSession:
      return open_session(r);
    case Op::kFreeSession: {
      const Handle h = session(r);
      r.finish();
      ch_->free_session(h);
      sessions_.erase(h);
      return w.bytes();
    }
    case Op::kPrefill:
      return prefill(r);
    case Op::kDecode: {
      const Handle s = session(r);
      const int32_t token = r.i32("token");
      r.finish();
      const size_t out = size_t(sessions_[s]);
      ch_->decode(s, token, std::span<float>(guarded(out).data(), out));
      check_guard(out, "decode");
      return floats_reply(out);
    }
    case Op::kPrefillGreedy:
      return prefill_greedy(r);
    case Op::kRewind: {
      const Handle s = session(r);
      const int32_t p = r.i32("position");
      r.finish();
      ch_->rewind(s, p);
      return w.bytes();
    }
    case Op::kPosition: {
      const Handle s = session(r);
      r.finish();
      w.i32(ch_->position(s));
      return w.bytes();
    }
    case Op::kSetTaps: {
      const Handle s = session(r);
      const bool enable = r.i32("enable") != 0;
      r.finish();
      ch_->set_taps(s, enable);
      return w.bytes();
    }
    case Op::kReadTaps:
      return read_taps(r);
    case Op::kStepBatch:
      return step_batch(r);
    case Op::kForkSession:
      return fork_session(r);
    case Op::kSetGrammar:
      return set_grammar(r);
    case Op::kGrammarMask:
      return grammar_mask(r);
    case Op::kGrammarGreedy:
      return grammar_greedy(r);
    case Op::kPrefillEmbeddings:
      return prefill_embeddings(r);
    case Op::kLoadVision:
      return load_vision(r);
    case Op::kEncodeImage:
      return encode_image(r);
    case Op::kPreprocessImage:
      return preprocess_image(r);
    case Op::kSetVisionOptions:
      return set_vision_options(r);
    case Op::kHello:
      break;
  }
  throw Error("runner: unexpected op {}", uint32_t(op));
}

// Reads the hello, loads the library, answers with BackendInfo (or the load error).
std::unique_ptr<Runner> hello(int in, int fd, const std::string& library) {
  uint8_t header[protocol::kHeaderSize];
  if (!read_exact(in, header, sizeof header)) quit(3);
  const auto h = protocol::parse_header(header, 64);
  std::vector<uint8_t> body(h.payload_len);
  if (!read_exact(in, body.data(), body.size())) quit(3);
  const uint32_t reply_op = uint32_t(Op::kHello) | protocol::kReplyBit;
  try {
    // The harness's version; an older one gets its own back (and the fields it knows).
    Reader r(body, "hello request");
    const uint32_t version = protocol::negotiate(r.u32("protocol_version"));
    auto ch = open_in_process(library);
    BackendInfo info = ch->info();
    info.protocol_version = version;
    Writer w;
    w.i32(TS_OK);
    protocol::encode(w, info);
    write_all(fd, protocol::frame(reply_op, w.bytes()));
    return std::make_unique<Runner>(std::move(ch), version);
  } catch (const std::exception& e) {
    write_all(fd, protocol::frame(reply_op, error_payload(TS_ERR_INTERNAL, e.what())));
    quit(0);
  }
}

// Requests on `in`, replies on `fd` (the same socket with --fd).
int serve(int in, int fd, const std::string& library) {
  auto runner = hello(in, fd, library);
  for (;;) {
    uint8_t header[protocol::kHeaderSize];
    if (!read_exact(in, header, sizeof header)) return 0;  // harness closed: done
    const auto h = protocol::parse_header(header, protocol::kMaxRequestPayload);
    std::vector<uint8_t> body(h.payload_len);
    if (!read_exact(in, body.data(), body.size())) return 0;
    const Op op = Op(h.op);
    Reader r(body, fmt::format("{} request", protocol::op_name(h.op)));
    std::string reply;
    try {
      reply = runner->handle(op, r);
    } catch (const protocol::ProtocolError& e) {
      reply = error_payload(
          runner->poisoned() ? protocol::kStatusContractViolation : TS_ERR_INVALID_ARGUMENT,
          e.what());
    } catch (const BackendError& e) {
      reply = error_payload(e.status(), e.detail().empty() ? e.what() : e.detail());
    } catch (const std::exception& e) {
      reply = error_payload(TS_ERR_INTERNAL, e.what());
    }
    write_all(fd, protocol::frame(h.op | protocol::kReplyBit, reply));
    if (runner->poisoned()) return 70;  // the heap may be corrupt: stop here
  }
}

}  // namespace
}  // namespace touchstone

namespace {

// --stdio: the protocol moves to private copies of stdin and stdout; fd 0
// becomes /dev/null and fd 1 a copy of stderr, so nothing the backend library
// prints can reach the channel. Returns {in, out}.
std::pair<int, int> take_stdio() {
  const int in = ::fcntl(0, F_DUPFD_CLOEXEC, 3), out = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
  const int null_in = ::open("/dev/null", O_RDONLY);
  if (in < 0 || out < 0 || null_in < 0 || ::dup2(null_in, 0) != 0 || ::dup2(2, 1) != 1) {
    std::fprintf(stderr, "touchstone-backend-runner: --stdio: %s\n", std::strerror(errno));
    std::exit(2);
  }
  ::close(null_in);
  return {in, out};
}

}  // namespace

int main(int argc, char** argv) {
  const bool stdio = argc == 3 && std::strcmp(argv[1], "--stdio") == 0;
  if (!stdio && (argc != 4 || std::strcmp(argv[1], "--fd") != 0)) {
    std::fprintf(stderr,
                 "usage: %s --fd N LIBRARY | --stdio LIBRARY\n(started by the touchstone "
                 "harness; see docs/protocol.md and docs/remote-backends.md)\n",
                 argv[0]);
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);  // a closed channel is EPIPE: write_all exits
  // SIGTERM, SIGINT, SIGHUP and the harness's death end the backend's
  // processes (its cgroup, else a sweep of this subreaper's descendants).
  touchstone::proc::install_runner_stop_handlers();
  const auto [in, out] = stdio ? take_stdio() : std::pair{std::atoi(argv[2]), std::atoi(argv[2])};
  int rc = 2;
  try {
    rc = touchstone::serve(in, out, argv[stdio ? 2 : 3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "touchstone-backend-runner: %s\n", e.what());
  }
  touchstone::proc::end_runner_descendants();  // nothing the backend started outlives it
  return rc;
}
