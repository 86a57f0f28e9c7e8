#include "touchstone/backend.h"

#include <algorithm>

#include "touchstone/error.h"

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

Model::Model(std::shared_ptr<BackendLibrary> lib, const std::string& gguf_path)
    : lib_(std::move(lib)) {
  model_ = lib_->channel().load_model(gguf_path, &n_vocab_);
  if (n_vocab_ <= 0) {
    lib_->channel().free_model(model_);
    throw BackendError(TS_ERR_INTERNAL, fmt::format("backend '{}': n_vocab() returned {} for {}",
                                                    lib_->name(), n_vocab_, gguf_path));
  }
}

Model::~Model() { lib_->channel().free_model(model_); }

int32_t Model::n_vocab() const { return n_vocab_; }

Session::Session(const Model& model, const SessionOptions& o) : lib_(model.library()) {
  ts_session_options opt{};
  opt.struct_size = sizeof(opt);
  opt.weight_path = o.weight_path;
  opt.n_threads = o.n_threads;
  opt.max_context = o.max_context;
  opt.fault = o.fault.empty() ? nullptr : o.fault.c_str();
  session_ = lib_->channel().open_session(model.handle(), opt);
  n_vocab_ = model.n_vocab();
}

Session::~Session() { lib_->channel().free_session(session_); }

std::vector<float> Session::prefill(std::span<const int32_t> tokens) {
  std::vector<float> logits(static_cast<size_t>(n_vocab_));
  lib_->channel().prefill(session_, tokens, false, logits);
  return logits;
}

std::vector<float> Session::prefill_all(std::span<const int32_t> tokens) {
  std::vector<float> logits(tokens.size() * size_t(n_vocab_));
  lib_->channel().prefill(session_, tokens, true, logits);
  return logits;
}

size_t Session::max_rows() const {
  constexpr size_t kMaxLogitsBytes = size_t{512} << 20;
  return std::max<size_t>(1, kMaxLogitsBytes / (size_t(n_vocab_) * sizeof(float)));
}

void Session::prefill_all_rows(std::span<const int32_t> tokens,
                               const std::function<void(size_t, std::span<const float>)>& row) {
  const size_t V = size_t(n_vocab_), chunk = max_rows();
  std::vector<float> logits;
  for (size_t start = 0; start < tokens.size(); start += chunk) {
    const size_t n = std::min(chunk, tokens.size() - start);
    logits.resize(n * V);
    lib_->channel().prefill(session_, tokens.subspan(start, n), true, logits);
    for (size_t i = 0; i < n; ++i) row(start + i, std::span<const float>(logits.data() + i * V, V));
  }
}

void Session::decode(int32_t token, std::span<float> logits) {
  if (logits.size() != size_t(n_vocab_)) {
    throw Error("decode: logits buffer holds {} floats, n_vocab is {}", logits.size(), n_vocab_);
  }
  lib_->channel().decode(session_, token, logits);
}

int32_t Session::prefill_greedy(std::span<const int32_t> tokens) {
  const int32_t tok = lib_->channel().prefill_greedy(session_, tokens);
  if (tok < 0 || tok >= n_vocab_) {
    throw Error("{}: prefill_greedy returned token {} outside [0, {})", lib_->name(), tok,
                n_vocab_);
  }
  return tok;
}

void Session::rewind(int32_t position) { lib_->channel().rewind(session_, position); }

void Session::set_taps(bool enable) { lib_->channel().set_taps(session_, enable); }

std::vector<float> Session::read_taps(size_t n_floats) {
  std::vector<float> out(n_floats);
  lib_->channel().read_taps(session_, out);
  return out;
}

int32_t Session::top_n_logprobs() {
  if (top_n_ < 0) {
    const ts_capabilities c = lib_->capabilities();
    top_n_ = (c.flags & TS_CAP_TOP_N_LOGPROBS) && c.top_n > 0 ? c.top_n : 0;
  }
  return top_n_;
}

int32_t Session::position() const { return lib_->channel().position(session_); }

}  // namespace touchstone
