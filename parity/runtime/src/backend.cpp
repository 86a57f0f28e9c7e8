#include "touchstone/runtime/backend.h"

#include <algorithm>

#include "touchstone/common/error.h"

namespace touchstone {

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

void BackendChannel::step_batch(std::span<const BatchCall> /*entries*/) {
  throw Error("backend '{}' has no step_batch (ABI v6)", info().name);
}

Handle BackendChannel::fork_session(Handle /*src*/, int32_t /*n_prefix*/) {
  throw Error("backend '{}' has no fork_session (ABI v6)", info().name);
}

void BackendChannel::prefill_embeddings(Handle /*session*/, std::span<const float> /*e*/,
                                        int32_t /*n_embd*/, bool /*bidirectional*/,
                                        bool /*all_positions*/, std::span<float> /*out*/) {
  throw Error("backend '{}' has no prefill_embeddings (ABI v8 TS_CAP_EMBEDDING_INPUT)",
              info().name);
}
void BackendChannel::load_vision(Handle /*model*/, const std::string& /*mmproj_path*/) {
  throw Error("backend '{}' has no load_vision (ABI v8 TS_CAP_MULTIMODAL)", info().name);
}
void BackendChannel::encode_image(Handle /*model*/, ts_image_format /*format*/,
                                  std::span<const uint8_t> /*data*/, int32_t /*height*/,
                                  int32_t /*width*/, std::span<float> /*out*/) {
  throw Error("backend '{}' has no encode_image (ABI v8 TS_CAP_MULTIMODAL)", info().name);
}

PixelTensor BackendChannel::preprocess_image(Handle /*model*/, std::span<const uint8_t> /*rgb*/,
                                             int32_t /*height*/, int32_t /*width*/) {
  throw Error("backend '{}' has no preprocess_image (ABI v9)", info().name);
}
void BackendChannel::set_vision_options(Handle /*model*/, const std::string& /*fault*/) {
  throw Error("backend '{}' has no set_vision_options (ABI v9)", info().name);
}

size_t pixel_tensor_size(const PixelTensor& t, const char* what) {
  const int64_t n = int64_t(t.n_frames) * t.channels * t.height * t.width;
  if (t.n_frames < 1 || t.channels != 3 || t.height < 1 || t.width < 1 || n > (int64_t{1} << 28))
    throw Error(
        "{}: the backend's pixel tensor is {} frame(s) of {} x {} x {} (want >= 1 frame of "
        "3 x height x width, at most 2^28 values)",
        what, t.n_frames, t.channels, t.height, t.width);
  return size_t(n);
}

void check_image_bytes(ts_image_format format, size_t bytes, int32_t height, int32_t width) {
  const size_t per = format == TS_IMAGE_PIXELS_F32 ? sizeof(float) : 1;
  if (height < 1 || width < 1 || bytes != size_t(3) * size_t(height) * size_t(width) * per)
    throw Error("encode_image: {} bytes for a 3 x {} x {} image of {} bytes per value", bytes,
                height, width, per);
}

void BackendChannel::set_grammar(Handle /*session*/, const ts_grammar* /*grammar*/) {
  throw Error("backend '{}' has no set_grammar (ABI v7)", info().name);
}
void BackendChannel::grammar_mask(Handle /*session*/, std::span<uint32_t> /*out*/) {
  throw Error("backend '{}' has no grammar_mask (ABI v7)", info().name);
}
void BackendChannel::grammar_greedy(Handle /*session*/, std::span<int32_t> /*out*/) {
  throw Error("backend '{}' has no grammar_greedy (ABI v7)", info().name);
}

std::shared_ptr<BackendLibrary> BackendLibrary::load(const std::string& name_or_path) {
  return std::make_shared<BackendLibrary>(open_in_process(name_or_path));
}

std::shared_ptr<BackendLibrary> BackendLibrary::spawn(const std::string& name_or_path,
                                                      const ChildOptions& options) {
  if (is_http_backend(name_or_path)) {
    HttpOptions h;
    h.call_timeout_s = options.call_timeout_s;
    return std::make_shared<BackendLibrary>(open_http(name_or_path, h));
  }
  return std::make_shared<BackendLibrary>(open_child_process(name_or_path, options));
}

BackendModel::BackendModel(std::shared_ptr<BackendLibrary> lib, const std::string& gguf_path)
    : lib_(std::move(lib)) {
  model_ = lib_->channel().load_model(gguf_path, &n_vocab_);
  if (n_vocab_ <= 0) {
    lib_->channel().free_model(model_);
    throw BackendError(TS_ERR_INTERNAL, fmt::format("backend '{}': n_vocab() returned {} for {}",
                                                    lib_->name(), n_vocab_, gguf_path));
  }
}

BackendModel::~BackendModel() { lib_->channel().free_model(model_); }

int32_t BackendModel::n_vocab() const { return n_vocab_; }

BatchMode BackendLibrary::batch_mode() const {
  if (!info().step_batch) return BatchMode::kHarness;
  return (capabilities().flags & TS_CAP_BATCHED_SESSIONS) ? BatchMode::kNative
                                                          : BatchMode::kBackendLoop;
}

const char* batch_mode_name(BatchMode mode) {
  switch (mode) {
    case BatchMode::kNative:
      return "native";
    case BatchMode::kBackendLoop:
      return "looped by the backend";
    case BatchMode::kHarness:
      return "emulated by the harness";
  }
  return "?";
}

BackendSession::BackendSession(const BackendModel& model, const BackendSessionOptions& o)
    : lib_(model.library()), model_(&model), options_(o) {
  ts_session_options opt{};
  opt.struct_size = sizeof(opt);
  opt.weight_path = o.weight_path;
  opt.n_threads = o.n_threads;
  opt.max_context = o.max_context;
  opt.fault = o.fault.empty() ? nullptr : o.fault.c_str();
  session_ = lib_->channel().open_session(model.handle(), opt);
  if (session_ == 0) {
    throw BackendError(
        TS_ERR_INTERNAL,
        fmt::format("backend '{}': open_session returned TS_OK with a NULL session", lib_->name()));
  }
  n_vocab_ = model.n_vocab();
}

BackendSession::BackendSession(const BackendModel& model, const BackendSessionOptions& o,
                               Handle forked)
    : lib_(model.library()),
      model_(&model),
      options_(o),
      session_(forked),
      n_vocab_(model.n_vocab()) {}

BackendSession::~BackendSession() { lib_->channel().free_session(session_); }

std::vector<float> BackendSession::prefill(std::span<const int32_t> tokens) {
  std::vector<float> logits(static_cast<size_t>(n_vocab_));
  lib_->channel().prefill(session_, tokens, false, logits);
  appended(tokens);
  return logits;
}

std::vector<float> BackendSession::prefill_all(std::span<const int32_t> tokens) {
  std::vector<float> logits(tokens.size() * size_t(n_vocab_));
  lib_->channel().prefill(session_, tokens, true, logits);
  appended(tokens);
  return logits;
}

std::vector<float> BackendSession::prefill_embeddings(std::span<const float> embeddings,
                                                      int32_t n_embd, bool bidirectional,
                                                      bool all_positions) {
  if (n_embd < 1 || embeddings.empty() || embeddings.size() % size_t(n_embd) != 0)
    throw Error("prefill_embeddings: {} floats are not rows of n_embd {}", embeddings.size(),
                n_embd);
  const size_t n = embeddings.size() / size_t(n_embd);
  std::vector<float> logits((all_positions ? n : 1) * size_t(n_vocab_));
  lib_->channel().prefill_embeddings(session_, embeddings, n_embd, bidirectional, all_positions,
                                     logits);
  history_.insert(history_.end(), n, -1);
  return logits;
}

void BackendModel::load_vision(const std::string& mmproj_path) {
  if (mmproj_path == vision_path_) return;
  lib_->channel().load_vision(model_, mmproj_path);
  vision_path_ = mmproj_path;
  if (!vision_fault_.empty()) lib_->channel().set_vision_options(model_, vision_fault_);
}

PixelTensor BackendModel::preprocess_image(std::span<const uint8_t> rgb, int32_t height,
                                           int32_t width) {
  return lib_->channel().preprocess_image(model_, rgb, height, width);
}

void BackendModel::set_vision_fault(const std::string& fault) {
  if (!lib_->has_vision_options())
    throw Error("backend '{}' takes no fault for its vision path (ABI v9 set_vision_options)",
                lib_->name());
  vision_fault_ = fault;
  if (!vision_path_.empty()) lib_->channel().set_vision_options(model_, fault);
}

std::vector<float> BackendModel::encode_image(ts_image_format format, std::span<const uint8_t> data,
                                              int32_t height, int32_t width, size_t n_floats) {
  std::vector<float> out(n_floats);
  lib_->channel().encode_image(model_, format, data, height, width, out);
  return out;
}

void BackendSession::step_batch(std::span<const Step> steps) {
  if (steps.empty()) return;
  const std::shared_ptr<BackendLibrary>& lib = steps[0].session->lib_;
  std::vector<BatchCall> calls;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& st = steps[i];
    if (!st.session || st.session->lib_ != lib)
      throw Error("step_batch: step {}: no session, or one of another backend", i);
    for (size_t j = 0; j < i; ++j)
      if (steps[j].session == st.session) throw Error("step_batch: step {}: session repeated", i);
    const size_t want = (st.all_positions ? st.tokens.size() : 1) * size_t(st.session->n_vocab_);
    if (st.tokens.empty() || st.logits.size() != want) {
      throw Error("step_batch: step {}: {} tokens, logits buffer of {} floats (expected {})", i,
                  st.tokens.size(), st.logits.size(), want);
    }
    calls.push_back({st.session->session_, st.tokens, st.all_positions, st.logits});
  }
  if (lib->batch_mode() == BatchMode::kHarness) {
    for (const Step& st : steps) {
      lib->channel().prefill(st.session->session_, st.tokens, st.all_positions, st.logits);
      st.session->appended(st.tokens);
    }
    return;
  }
  lib->channel().step_batch(calls);
  for (const Step& st : steps) st.session->appended(st.tokens);
}

std::unique_ptr<BackendSession> BackendSession::fork(int32_t n_prefix) {
  if (n_prefix < 0 || size_t(n_prefix) > history_.size())
    throw Error("fork: n_prefix {} outside [0, {}]", n_prefix, history_.size());
  const std::span<const int32_t> prefix(history_.data(), size_t(n_prefix));
  if (!lib_->has_fork()) {  // emulated: a fresh session prefills the same tokens
    if (std::find(prefix.begin(), prefix.end(), -1) != prefix.end())
      throw Error(
          "fork: backend '{}' has no fork_session and the prefix holds input "
          "embeddings (an emulated fork replays tokens only)",
          lib_->name());
    auto s = std::make_unique<BackendSession>(*model_, options_);
    const bool grammar = grammar_start_ >= 0 && grammar_start_ <= n_prefix;
    const size_t before = grammar ? size_t(grammar_start_) : size_t(n_prefix);
    if (before > 0) s->prefill(prefix.first(before));
    if (grammar) {
      s->set_grammar(grammar_kind_, grammar_text_);
      if (before < prefix.size()) s->prefill(prefix.subspan(before));
    }
    return s;
  }
  const Handle h = lib_->channel().fork_session(session_, n_prefix);
  if (h == 0 || h == session_) {  // in process: no runner to check the handle
    throw BackendError(TS_ERR_INTERNAL,
                       fmt::format("backend '{}': fork_session returned TS_OK with {} session",
                                   lib_->name(), h == 0 ? "a NULL" : "its source"));
  }
  std::unique_ptr<BackendSession> s(new BackendSession(*model_, options_, h));
  s->appended(prefix);
  if (grammar_start_ >= 0 && grammar_start_ <= n_prefix) {
    s->grammar_start_ = grammar_start_;
    s->grammar_kind_ = grammar_kind_;
    s->grammar_text_ = grammar_text_;
  }
  return s;
}

size_t BackendSession::max_rows() const {
  constexpr size_t kMaxLogitsBytes = size_t{512} << 20;
  return std::max<size_t>(1, kMaxLogitsBytes / (size_t(n_vocab_) * sizeof(float)));
}

void BackendSession::prefill_all_rows(
    std::span<const int32_t> tokens,
    const std::function<void(size_t, std::span<const float>)>& row) {
  const size_t V = size_t(n_vocab_), chunk = max_rows();
  std::vector<float> logits;
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    const size_t n = std::min(chunk, tokens.size() - start);
    logits.resize(n * V);
    lib_->channel().prefill(session_, tokens.subspan(start, n), true, logits);
    appended(tokens.subspan(start, n));
    for (size_t i = 0; i < n; ++i) row(start + i, std::span<const float>(logits.data() + i * V, V));
  }
}

void BackendSession::decode(int32_t token, std::span<float> logits) {
  if (logits.size() != size_t(n_vocab_)) {
    throw Error("decode: logits buffer holds {} floats, n_vocab is {}", logits.size(), n_vocab_);
  }
  lib_->channel().decode(session_, token, logits);
  history_.push_back(token);
}

int32_t BackendSession::prefill_greedy(std::span<const int32_t> tokens) {
  const int32_t tok = lib_->channel().prefill_greedy(session_, tokens);
  if (tok < 0 || tok >= n_vocab_) {
    throw Error("{}: prefill_greedy returned token {} outside [0, {})", lib_->name(), tok,
                n_vocab_);
  }
  appended(tokens);
  return tok;
}

void BackendSession::rewind(int32_t position) {
  lib_->channel().rewind(session_, position);
  if (position >= 0 && size_t(position) < history_.size()) history_.resize(size_t(position));
  if (position < grammar_start_) grammar_start_ = -1;  // rewound past it: removed
}

void BackendSession::set_grammar(ts_grammar_kind kind, const std::string& text) {
  ts_grammar g{};
  g.struct_size = sizeof g;
  g.kind = kind;
  g.text = text.c_str();
  lib_->channel().set_grammar(session_, &g);
  grammar_start_ = int32_t(history_.size());
  grammar_kind_ = kind;
  grammar_text_ = text;
}

void BackendSession::clear_grammar() {
  lib_->channel().set_grammar(session_, nullptr);
  grammar_start_ = -1;
}

std::vector<uint32_t> BackendSession::grammar_mask() {
  std::vector<uint32_t> mask(size_t(TS_MASK_WORDS(n_vocab_)));
  lib_->channel().grammar_mask(session_, mask);
  return mask;
}

std::optional<std::vector<uint32_t>> BackendSession::exposed_grammar_mask() {
  try {
    return grammar_mask();
  } catch (const BackendError& e) {
    if (e.status() != TS_ERR_UNSUPPORTED) throw;
    return std::nullopt;
  }
}

std::vector<int32_t> BackendSession::grammar_greedy(int32_t n_positions) {
  std::vector<int32_t> tokens(size_t(std::max(n_positions, 1)), -1);
  lib_->channel().grammar_greedy(session_, tokens);
  for (int32_t t : tokens) {
    if (t < -1 || t >= n_vocab_)
      throw Error("{}: grammar_greedy returned token {} outside [-1, {})", lib_->name(), t,
                  n_vocab_);
  }
  return tokens;
}

void BackendSession::set_taps(bool enable) { lib_->channel().set_taps(session_, enable); }

std::vector<float> BackendSession::read_taps(size_t n_floats) {
  std::vector<float> out(n_floats);
  lib_->channel().read_taps(session_, out);
  return out;
}

int32_t BackendSession::top_n_logprobs() {
  if (top_n_ < 0) {
    const ts_capabilities c = lib_->capabilities();
    top_n_ = (c.flags & TS_CAP_TOP_N_LOGPROBS) && c.top_n > 0 ? c.top_n : 0;
  }
  return top_n_;
}

int32_t BackendSession::position() const { return lib_->channel().position(session_); }

}  // namespace touchstone
