// The in-process channel: the dlopen()ed ts_backend table, called directly.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>

#include "touchstone/runtime/backend.h"
#include "touchstone/runtime/backend_channel.h"

namespace touchstone {
namespace fs = std::filesystem;
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
  if (!ec) {
    dirs.push_back(exe.parent_path().parent_path() / "lib");                 // build tree
    dirs.push_back(exe.parent_path().parent_path() / "lib" / "touchstone");  // installed
  }
  if (const fs::path lib = harness_code_dir(); !lib.empty() && lib != exe.parent_path()) {
    dirs.push_back(lib / "touchstone");  // the SDK's lib/ (libtouchstone_parity.so)
    dirs.push_back(lib);
  }
  return dirs;
}

// Loads the table; the handle stays open for the life of the process
// (backends may own threads/driver state whose static destructors crash when
// unloaded at exit).
const ts_backend* load_table(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw Error("cannot load backend '{}': {}", path, dlerror());
  auto entry = reinterpret_cast<ts_backend_entry_fn>(dlsym(handle, TS_BACKEND_ENTRY_SYMBOL));
  if (!entry) throw Error("backend '{}' does not export {}()", path, TS_BACKEND_ENTRY_SYMBOL);
  const ts_backend* api = entry();
  if (!api) throw Error("backend '{}': {}() returned NULL", path, TS_BACKEND_ENTRY_SYMBOL);
  if (api->api_version < 1 || api->api_version > TS_BACKEND_API_VERSION) {
    throw Error("backend '{}' implements api_version {}, this harness supports 1..{}", path,
                api->api_version, TS_BACKEND_API_VERSION);
  }
  const bool complete = api->last_error && api->device_name && api->capabilities &&
                        api->load_model && api->free_model && api->n_vocab && api->open_session &&
                        api->free_session && api->prefill && api->decode && api->rewind &&
                        api->position;
  if (!complete) throw Error("backend '{}' leaves a required function pointer NULL", path);
  if (!api->name || !api->version) throw Error("backend '{}' has a NULL name or version", path);
  return api;
}

class InProcessChannel final : public BackendChannel {
 public:
  InProcessChannel(const ts_backend* api, std::string path) : api_(api) {
    info_.api_version = api->api_version;
    info_.name = api->name;
    info_.version = api->version;
    info_.path = std::move(path);
    const char* d = api->device_name();
    info_.device = d ? d : "(unknown device)";
    if (api->api_version >= 2) {
      // The greedy entry is used only when the backend claims the capability;
      // claiming it with a NULL entry is an error. A backend that cannot report
      // capabilities now (no device) is loaded without it: its later calls fail
      // with their own status.
      ts_capabilities caps{};
      caps.struct_size = uint32_t(api->api_version >= 6   ? sizeof(caps)
                                  : api->api_version >= 5 ? TS_CAPABILITIES_V5_SIZE
                                                          : TS_CAPABILITIES_V4_SIZE);
      const bool claims =
          api->capabilities(&caps) == TS_OK && (caps.flags & TS_CAP_DEVICE_GREEDY) != 0;
      if (claims && !api->prefill_greedy) {
        throw Error("backend '{}' claims TS_CAP_DEVICE_GREEDY but prefill_greedy is NULL",
                    info_.path);
      }
      info_.device_greedy = claims;
    }
    if (api->api_version >= 3 && api->architectures) {
      info_.declares_models = true;
      info_.architectures = api->architectures;
      info_.model_features = api->model_features ? api->model_features : "";
    }
    if (api->api_version >= 4 && (api->set_taps || api->read_taps)) {
      if (!api->set_taps || !api->read_taps) {
        throw Error(
            "backend '{}' sets only one of set_taps and read_taps (ABI v4: both or neither)",
            info_.path);
      }
      info_.taps = true;
    }
    if (api->api_version >= 6) serving_members(api);
    if (api->api_version >= 7) grammar_members(api);
    if (api->api_version >= 8) multimodal_members(api);
    if (api->api_version >= 9) {  // both need the tower (ABI v9)
      info_.preprocess = api->preprocess_image != nullptr;
      info_.vision_options = api->set_vision_options != nullptr;
      if ((info_.preprocess || info_.vision_options) && !info_.vision)
        throw Error(
            "backend '{}' sets preprocess_image or set_vision_options without load_vision "
            "(ABI v9: both work on the tower load_vision attaches)",
            info_.path);
    }
  }

  const BackendInfo& info() const override { return info_; }

  ts_capabilities capabilities() override {
    ts_capabilities caps{};
    // ABI v5 appended top_n: an older table gets the struct it knows.
    caps.struct_size = uint32_t(api_->api_version >= 6   ? sizeof(caps)
                                : api_->api_version >= 5 ? TS_CAPABILITIES_V5_SIZE
                                                         : TS_CAPABILITIES_V4_SIZE);
    check(api_->capabilities(&caps), "capabilities");
    if (api_->api_version < 5 || caps.struct_size < TS_CAPABILITIES_V5_SIZE) {
      caps.top_n = 0;
      caps.flags &= ~TS_CAP_TOP_N_LOGPROBS;
    }
    // Flags and fields of ABI v6 mean nothing in an older table (bits 2 and 3
    // meant something looser before v6).
    if (api_->api_version < 6 || caps.struct_size < sizeof(caps)) {
      caps.batch_invariant_paths = 0;
      caps.max_batch = 0;
      caps.flags &= ~(TS_CAP_BATCH_INVARIANT | TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY |
                      TS_CAP_BITWISE_NOT_ACROSS_FORKS);
    }
    if (api_->api_version < 7) caps.flags &= ~TS_CAP_STRUCTURED_OUTPUT;
    if (api_->api_version < 8) caps.flags &= ~(TS_CAP_EMBEDDING_INPUT | TS_CAP_MULTIMODAL);
    caps.struct_size = sizeof(caps);
    return caps;
  }
  Handle load_model(const std::string& gguf_path, int32_t* n_vocab) override {
    ts_model* m = nullptr;
    check(api_->load_model(gguf_path.c_str(), &m), "load_model");
    *n_vocab = api_->n_vocab(m);
    return reinterpret_cast<Handle>(m);
  }
  void free_model(Handle m) noexcept override { api_->free_model(model(m)); }
  Handle open_session(Handle m, const ts_session_options& o) override {
    ts_session* s = nullptr;
    check(api_->open_session(model(m), &o, &s), "open_session");
    return reinterpret_cast<Handle>(s);
  }
  void free_session(Handle s) noexcept override { api_->free_session(session(s)); }
  void prefill(Handle s, std::span<const int32_t> t, bool all, std::span<float> out) override {
    check(api_->prefill(session(s), t.data(), int32_t(t.size()), all ? 1 : 0, out.data()),
          all ? "prefill(all positions)" : "prefill");
  }
  void decode(Handle s, int32_t token, std::span<float> out) override {
    check(api_->decode(session(s), token, out.data()), "decode");
  }
  int32_t prefill_greedy(Handle s, std::span<const int32_t> t) override {
    if (!info_.device_greedy) {
      throw Error("{}: backend has no device greedy (TS_CAP_DEVICE_GREEDY)", info_.name);
    }
    int32_t tok = -1;
    check(api_->prefill_greedy(session(s), t.data(), int32_t(t.size()), &tok), "prefill_greedy");
    return tok;
  }
  void rewind(Handle s, int32_t p) override { check(api_->rewind(session(s), p), "rewind"); }
  int32_t position(Handle s) override { return api_->position(session(s)); }
  void set_taps(Handle s, bool enable) override {
    need_taps();
    check(api_->set_taps(session(s), enable ? 1 : 0), "set_taps");
  }
  void read_taps(Handle s, std::span<float> out) override {
    need_taps();
    check(api_->read_taps(session(s), out.data(), int64_t(out.size())), "read_taps");
  }
  void step_batch(std::span<const BatchCall> entries) override {
    if (!info_.step_batch) BackendChannel::step_batch(entries);
    std::vector<ts_batch_entry> e(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      e[i].struct_size = sizeof(ts_batch_entry);
      e[i].session = session(entries[i].session);
      e[i].tokens = entries[i].tokens.data();
      e[i].n_tokens = int32_t(entries[i].tokens.size());
      e[i].all_positions = entries[i].all_positions ? 1 : 0;
      e[i].logits_out = entries[i].out.data();
    }
    check(api_->step_batch(e.data(), int32_t(e.size())), "step_batch");
  }
  Handle fork_session(Handle src, int32_t n_prefix) override {
    if (!info_.fork) return BackendChannel::fork_session(src, n_prefix);
    ts_session* out = nullptr;
    check(api_->fork_session(session(src), n_prefix, &out), "fork_session");
    return reinterpret_cast<Handle>(out);
  }
  void set_grammar(Handle s, const ts_grammar* g) override {
    if (!info_.grammar) BackendChannel::set_grammar(s, g);
    check(api_->set_grammar(session(s), g), "set_grammar");
  }
  void grammar_mask(Handle s, std::span<uint32_t> out) override {
    if (!info_.grammar) BackendChannel::grammar_mask(s, out);
    check(api_->grammar_mask(session(s), out.data(), int32_t(out.size())), "grammar_mask");
  }
  void grammar_greedy(Handle s, std::span<int32_t> out) override {
    if (!info_.grammar) BackendChannel::grammar_greedy(s, out);
    check(api_->grammar_greedy(session(s), int32_t(out.size()), out.data()), "grammar_greedy");
  }
  void prefill_embeddings(Handle s, std::span<const float> e, int32_t n_embd, bool bidirectional,
                          bool all, std::span<float> out) override {
    if (!info_.embeddings)
      BackendChannel::prefill_embeddings(s, e, n_embd, bidirectional, all, out);
    ts_embedding_input in{};
    in.struct_size = sizeof in;
    in.embeddings = e.data();
    in.n_embd = n_embd;
    in.n_tokens = n_embd > 0 ? int32_t(e.size() / size_t(n_embd)) : 0;
    in.bidirectional = bidirectional ? 1 : 0;
    check(api_->prefill_embeddings(session(s), &in, all ? 1 : 0, out.data()), "prefill_embeddings");
  }
  void load_vision(Handle m, const std::string& path) override {
    if (!info_.vision) BackendChannel::load_vision(m, path);
    check(api_->load_vision(model(m), path.c_str()), "load_vision");
  }
  void encode_image(Handle m, ts_image_format format, std::span<const uint8_t> data, int32_t height,
                    int32_t width, std::span<float> out) override {
    if (!info_.vision) BackendChannel::encode_image(m, format, data, height, width, out);
    const ts_image img = image_of(format, data, height, width);
    check(api_->encode_image(model(m), &img, out.data(), int64_t(out.size())), "encode_image");
  }
  // ABI v9: the shape first (pixels_out NULL), then the tensor.
  PixelTensor preprocess_image(Handle m, std::span<const uint8_t> rgb, int32_t height,
                               int32_t width) override {
    if (!info_.preprocess) return BackendChannel::preprocess_image(m, rgb, height, width);
    const ts_image img = image_of(TS_IMAGE_RGB8, rgb, height, width);
    ts_pixel_shape shape{};
    shape.struct_size = sizeof shape;
    check(api_->preprocess_image(model(m), &img, &shape, nullptr, 0), "preprocess_image");
    PixelTensor out{shape.n_frames, shape.channels, shape.height, shape.width, {}};
    out.values.resize(pixel_tensor_size(out, "preprocess_image"));
    check(api_->preprocess_image(model(m), &img, &shape, out.values.data(),
                                 int64_t(out.values.size())),
          "preprocess_image");
    return out;
  }
  void set_vision_options(Handle m, const std::string& fault) override {
    if (!info_.vision_options) BackendChannel::set_vision_options(m, fault);
    ts_vision_options o{};
    o.struct_size = sizeof o;
    o.fault = fault.empty() ? nullptr : fault.c_str();
    check(api_->set_vision_options(model(m), &o), "set_vision_options");
  }

 private:
  // ABI v6: a flag that claims a member the table leaves NULL is refused.
  void serving_members(const ts_backend* api) {
    info_.step_batch = api->step_batch != nullptr;
    info_.fork = api->fork_session != nullptr;
    ts_capabilities caps{};
    caps.struct_size = sizeof(caps);
    if (api->capabilities(&caps) != TS_OK) return;
    if ((caps.flags & TS_CAP_BATCHED_SESSIONS) && !info_.step_batch)
      throw Error("backend '{}' claims TS_CAP_BATCHED_SESSIONS but step_batch is NULL", info_.path);
    if ((caps.flags & TS_CAP_KV_PREFIX_COPY) && !info_.fork)
      throw Error("backend '{}' claims TS_CAP_KV_PREFIX_COPY but fork_session is NULL", info_.path);
  }

  // ABI v7: the three grammar members all set or all NULL, and set exactly
  // when TS_CAP_STRUCTURED_OUTPUT is claimed.
  void grammar_members(const ts_backend* api) {
    const int n = (api->set_grammar != nullptr) + (api->grammar_mask != nullptr) +
                  (api->grammar_greedy != nullptr);
    if (n != 0 && n != 3) {
      throw Error(
          "backend '{}' sets only some of set_grammar, grammar_mask and grammar_greedy (ABI v7: "
          "all three or none)",
          info_.path);
    }
    info_.grammar = n == 3;
    ts_capabilities caps{};
    caps.struct_size = sizeof(caps);
    if (api->capabilities(&caps) != TS_OK) return;
    if ((caps.flags & TS_CAP_STRUCTURED_OUTPUT) && !info_.grammar)
      throw Error("backend '{}' claims TS_CAP_STRUCTURED_OUTPUT but set_grammar is NULL",
                  info_.path);
  }

  // ABI v8: load_vision and encode_image both set or both NULL; each flag exactly when
  // its members are set.
  void multimodal_members(const ts_backend* api) {
    if ((api->load_vision != nullptr) != (api->encode_image != nullptr)) {
      throw Error(
          "backend '{}' sets only one of load_vision and encode_image (ABI v8: both or "
          "neither)",
          info_.path);
    }
    info_.embeddings = api->prefill_embeddings != nullptr;
    info_.vision = api->load_vision != nullptr;
    ts_capabilities caps{};
    caps.struct_size = sizeof(caps);
    if (api->capabilities(&caps) != TS_OK) return;
    if ((caps.flags & TS_CAP_EMBEDDING_INPUT) && !info_.embeddings)
      throw Error("backend '{}' claims TS_CAP_EMBEDDING_INPUT but prefill_embeddings is NULL",
                  info_.path);
    if ((caps.flags & TS_CAP_MULTIMODAL) && !info_.vision)
      throw Error("backend '{}' claims TS_CAP_MULTIMODAL but load_vision is NULL", info_.path);
  }

  void need_taps() const {
    if (!info_.taps) throw Error("{}: backend has no layer taps (ABI v4)", info_.name);
  }
  // A 3-channel ts_image over `data` (its byte count checked).
  static ts_image image_of(ts_image_format format, std::span<const uint8_t> data, int32_t height,
                           int32_t width) {
    check_image_bytes(format, data.size(), height, width);
    ts_image img{};
    img.struct_size = sizeof img;
    img.format = format;
    img.data = data.data();
    img.channels = 3;
    img.height = height;
    img.width = width;
    return img;
  }
  static ts_model* model(Handle h) { return reinterpret_cast<ts_model*>(h); }
  static ts_session* session(Handle h) { return reinterpret_cast<ts_session*>(h); }
  // Throws BackendError "backend '<name>': <what>: <status>: <last_error>".
  void check(ts_status status, const char* what) const {
    if (status == TS_OK) return;
    const char* m = api_->last_error();
    const std::string msg = m && *m ? m : "(no message)";
    throw BackendError(
        status, fmt::format("backend '{}': {}: {}: {}", info_.name, what, status_name(status), msg),
        msg);
  }

  const ts_backend* api_;
  BackendInfo info_;
};

}  // namespace

fs::path harness_code_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&harness_code_dir), &info) == 0 || !info.dli_fname)
    return {};
  std::error_code ec;
  const fs::path p = fs::canonical(info.dli_fname, ec);
  return ec ? fs::path() : p.parent_path();
}

std::vector<std::string> exec_command(std::string_view spec) {
  std::vector<std::string> argv;
  const std::string_view prefix = is_stdio_backend(spec)  ? kStdioPrefix
                                  : is_exec_backend(spec) ? kExecPrefix
                                                          : std::string_view();
  std::string_view rest = spec.substr(prefix.size());
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  while (!rest.empty()) {
    const size_t start = rest.find_first_not_of(kSpace);
    if (start == std::string_view::npos) break;
    const size_t end = rest.find_first_of(kSpace, start);
    argv.emplace_back(rest.substr(start, end == std::string_view::npos ? end : end - start));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  }
  if (argv.empty()) {
    throw Error(
        "backend '{}': no command after '{}' (expected e.g. 'exec:python3 -m "
        "touchstone_engine.examples.numpy_llama')",
        spec, prefix);
  }
  return argv;
}

std::string resolve_backend_path(const std::string& name_or_path) {
  if (is_exec_backend(name_or_path) || is_http_backend(name_or_path)) return name_or_path;
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 3 && name_or_path.ends_with(".so"));
  if (is_path) {
    if (!fs::exists(name_or_path)) throw Error("backend library '{}' does not exist", name_or_path);
    return name_or_path;
  }
  const std::string file = "libtouchstone_backend_" + name_or_path + ".so";
  std::string tried;
  for (const fs::path& dir : search_dirs()) {
    const fs::path candidate = dir / file;
    if (fs::exists(candidate)) return candidate.string();
    tried += "\n  " + candidate.string();
  }
  throw Error("backend '{}' not found; looked for:{}\n(set TOUCHSTONE_BACKEND_PATH or pass a path)",
              name_or_path, tried);
}

std::unique_ptr<BackendChannel> open_in_process(const std::string& name_or_path) {
  if (is_exec_backend(name_or_path)) {
    throw Error(
        "backend '{}' is a command, not a library: it runs only as a child process (drop "
        "--in-process)",
        name_or_path);
  }
  // A server is reached the same way with or without --in-process.
  if (is_http_backend(name_or_path)) return open_http(name_or_path, HttpOptions{});
  const std::string path = resolve_backend_path(name_or_path);
  return std::make_unique<InProcessChannel>(load_table(path), path);
}

}  // namespace touchstone
