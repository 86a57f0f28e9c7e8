// touchstone::BackendAdapter<Impl> (touchstone/abi/backend_adapter.hpp): the table it
// builds, the shared checks it makes before the backend sees a call, and how it
// maps exceptions to ts_status. Two toy backends: one with every optional
// member, one with none.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "touchstone/abi/backend_adapter.hpp"

namespace {

constexpr int32_t kVocab = 5;

// Logits of a position: token t at position p scores (t + p) in slot (t + p) % kVocab.
void fill(int32_t token, int32_t pos, float* out) {
  for (int32_t i = 0; i < kVocab; ++i) out[i] = 0.0f;
  out[(token + pos) % kVocab] = float(token + pos);
}

struct Full {
  static constexpr const char* name = "full";
  static constexpr const char* version = "1.2.3";
  static constexpr const char* architectures = "llama";
  static constexpr const char* model_features = "";
  static inline int decode_calls = 0;

  struct Model {
    int32_t n_vocab() const { return kVocab; }
  };
  struct Session {
    int32_t pos = 0, max_ctx = 4;
    bool taps = false;
    int32_t position() const { return pos; }
    int32_t max_context() const { return max_ctx; }
    void prefill(std::span<const int32_t> t, bool all, float* logits) {
      if (t[0] == 3) throw std::runtime_error("token 3 breaks me");
      if (t[0] == 4) throw std::bad_alloc();
      for (size_t i = 0; i < t.size(); ++i) fill(t[i], pos++, all ? logits + i * kVocab : logits);
    }
    void decode(int32_t token, float* logits) {
      ++decode_calls;
      fill(token, pos++, logits);
    }
    int32_t prefill_greedy(std::span<const int32_t> t) {
      std::vector<float> l(kVocab);
      prefill(t, false, l.data());
      return touchstone::abi::greedy_argmax(l.data(), kVocab);
    }
    void rewind(int32_t p) { pos = p; }
    void set_taps(bool on) { taps = on; }
    void read_taps(float* out, int64_t n) {
      const float rec[2] = {1.0f, 2.0f};
      touchstone::abi::copy_taps(rec, taps ? 2 : 0, out, n);
    }
  };
  static std::string device_name() { return "toy device"; }
  static void capabilities(ts_capabilities& c) { c.flags = TS_CAP_ALL_POSITION_LOGITS; }
  static std::unique_ptr<Model> load_model(const std::string& path) {
    if (path == "missing.gguf")
      throw touchstone::abi::StatusError(TS_ERR_IO, "missing.gguf: no such file");
    return std::make_unique<Model>();
  }
  static std::unique_ptr<Session> open_session(Model&, const ts_session_options& o) {
    if (o.fault && *o.fault) throw touchstone::abi::StatusError(TS_ERR_UNSUPPORTED, "no faults");
    auto s = std::make_unique<Session>();
    if (o.max_context > 0) s->max_ctx = o.max_context;
    return s;
  }
};

struct Minimal {
  static constexpr const char* name = "minimal";
  static constexpr const char* version = "0";
  struct Model {
    int32_t n_vocab() const { return kVocab; }
  };
  struct Session {
    int32_t pos = 0;
    int32_t position() const { return pos; }
    int32_t max_context() const { return 8; }
    void prefill(std::span<const int32_t> t, bool, float* logits) {
      for (int32_t tok : t) fill(tok, pos++, logits);
    }
    void rewind(int32_t p) { pos = p; }
  };
  static std::string device_name() { throw std::runtime_error("probe failed"); }
  // Claims ABI v6 calls it does not have: the adapter clears both flags.
  static void capabilities(ts_capabilities& c) {
    c.flags = TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY;
  }
  static std::unique_ptr<Model> load_model(const std::string&) { return std::make_unique<Model>(); }
  static std::unique_ptr<Session> open_session(Model&, const ts_session_options&) {
    return std::make_unique<Session>();
  }
};

// ABI v6: fork and a native step_batch. Logits as fill(); step_batch can be
// told to throw after advancing every session (the adapter must roll back).
struct Batched {
  static constexpr const char* name = "batched";
  static constexpr const char* version = "6";
  static inline bool throw_after_advancing = false;
  static inline int batch_calls = 0;
  struct Model {
    int32_t n_vocab() const { return kVocab; }
  };
  struct Session {
    int32_t pos = 0, max_ctx = 8;
    int32_t position() const { return pos; }
    int32_t max_context() const { return max_ctx; }
    void prefill(std::span<const int32_t> t, bool all, float* logits) {
      for (size_t i = 0; i < t.size(); ++i) fill(t[i], pos++, all ? logits + i * kVocab : logits);
    }
    void rewind(int32_t p) { pos = p; }
    std::unique_ptr<Session> fork(int32_t n) {
      auto s = std::make_unique<Session>(*this);
      s->pos = n;
      return s;
    }
  };
  static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
    ++batch_calls;
    for (const auto& it : items) it.session->prefill(it.tokens, it.all_positions, it.logits);
    if (throw_after_advancing) throw std::runtime_error("device lost mid-batch");
  }
  static std::string device_name() { return "batched device"; }
  static void capabilities(ts_capabilities& c) {
    c.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BATCHED_SESSIONS;
    c.max_batch = 3;
  }
  static std::unique_ptr<Model> load_model(const std::string&) { return std::make_unique<Model>(); }
  static std::unique_ptr<Session> open_session(Model&, const ts_session_options& o) {
    auto s = std::make_unique<Session>();
    if (o.max_context > 0) s->max_ctx = o.max_context;
    return s;
  }
};

struct Opened {
  const ts_backend* t;
  ts_model* model = nullptr;
  ts_session* session = nullptr;
  std::vector<ts_session*> more;
  explicit Opened(const ts_backend* table, int32_t max_context = 0) : t(table) {
    EXPECT_EQ(t->load_model("m.gguf", &model), TS_OK);
    session = another(max_context);
  }
  // One more session of the same model (freed with this).
  ts_session* another(int32_t max_context = 0, ts_weight_path path = TS_WEIGHTS_FULL_PRECISION) {
    ts_session_options o{sizeof(ts_session_options), path, 0, max_context, nullptr};
    ts_session* s = nullptr;
    EXPECT_EQ(t->open_session(model, &o, &s), TS_OK);
    if (session) more.push_back(s);
    return s;
  }
  ~Opened() {
    for (ts_session* s : more) t->free_session(s);
    t->free_session(session);
    t->free_model(model);
  }
};

TEST(BackendAdapter, TableCarriesIdentityAndOptionalMembers) {
  const ts_backend* t = touchstone::BackendAdapter<Full>::table();
  EXPECT_EQ(t->api_version, uint32_t(TS_BACKEND_API_VERSION));
  EXPECT_STREQ(t->name, "full");
  EXPECT_STREQ(t->version, "1.2.3");
  EXPECT_STREQ(t->architectures, "llama");
  EXPECT_STREQ(t->model_features, "");
  EXPECT_STREQ(t->device_name(), "toy device");
  EXPECT_NE(t->prefill_greedy, nullptr);
  EXPECT_NE(t->set_taps, nullptr);
  EXPECT_NE(t->read_taps, nullptr);
  ts_capabilities c{};
  c.struct_size = sizeof c;
  ASSERT_EQ(t->capabilities(&c), TS_OK);
  EXPECT_EQ(c.flags, TS_CAP_ALL_POSITION_LOGITS | TS_CAP_DEVICE_GREEDY);  // greedy: from the member

  const ts_backend* m = touchstone::BackendAdapter<Minimal>::table();
  EXPECT_EQ(m->prefill_greedy, nullptr);
  EXPECT_EQ(m->set_taps, nullptr);
  EXPECT_EQ(m->read_taps, nullptr);
  EXPECT_EQ(m->step_batch, nullptr);
  EXPECT_EQ(m->fork_session, nullptr);
  EXPECT_EQ(t->step_batch, nullptr);
  EXPECT_EQ(t->fork_session, nullptr);
  EXPECT_EQ(m->architectures, nullptr);  // not declared: load_model decides
  EXPECT_EQ(m->model_features, nullptr);
  ASSERT_EQ(m->capabilities(&c), TS_OK);
  EXPECT_EQ(c.flags, 0u);  // its claims of BATCHED_SESSIONS and KV_PREFIX_COPY cleared
  EXPECT_NE(std::string(m->device_name()).find("probe failed"), std::string::npos);
}

// ABI v5 appended ts_capabilities.top_n: a caller built against the v4 header
// passes the smaller struct, and the adapter must fill only that part.
TEST(BackendAdapter, CapabilitiesFillOnlyTheCallersStructSize) {
  const ts_backend* t = touchstone::BackendAdapter<Full>::table();
  struct {
    ts_capabilities c;
    unsigned char guard[16];
  } buf;
  std::memset(&buf, 0xAB, sizeof buf);
  buf.c.struct_size = uint32_t(TS_CAPABILITIES_V4_SIZE);
  ASSERT_EQ(t->capabilities(&buf.c), TS_OK);
  EXPECT_EQ(buf.c.struct_size, uint32_t(TS_CAPABILITIES_V4_SIZE));
  const auto* top_n = reinterpret_cast<const unsigned char*>(&buf.c) + TS_CAPABILITIES_V4_SIZE;
  for (size_t i = 0; i < sizeof(int32_t); ++i) EXPECT_EQ(top_n[i], 0xAB) << "byte " << i;
  EXPECT_EQ(buf.c.flags, TS_CAP_ALL_POSITION_LOGITS | TS_CAP_DEVICE_GREEDY);
  buf.c.struct_size = uint32_t(TS_CAPABILITIES_V4_SIZE - 1);
  EXPECT_EQ(t->capabilities(&buf.c), TS_ERR_INVALID_ARGUMENT);
  ts_capabilities full{};
  full.struct_size = sizeof full;
  ASSERT_EQ(t->capabilities(&full), TS_OK);
  EXPECT_EQ(full.struct_size, uint32_t(sizeof full));
  EXPECT_EQ(full.top_n, 0);
}

TEST(BackendAdapter, SharedChecksBeforeTheBackend) {
  const ts_backend* t = touchstone::BackendAdapter<Full>::table();
  ts_capabilities small{};
  small.struct_size = 4;
  EXPECT_EQ(t->capabilities(&small), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->capabilities(nullptr), TS_ERR_INVALID_ARGUMENT);
  ts_model* model = nullptr;
  EXPECT_EQ(t->load_model(nullptr, &model), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->load_model("missing.gguf", &model), TS_ERR_IO);
  EXPECT_STREQ(t->last_error(), "missing.gguf: no such file");
  EXPECT_EQ(model, nullptr);

  Opened o(t);
  float logits[kVocab * 4];
  const int32_t bad[2] = {1, kVocab};
  EXPECT_EQ(t->prefill(o.session, bad, 2, 0, logits), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(t->last_error(), "token #1 = 5 outside [0, 5)");
  EXPECT_EQ(t->decode(o.session, -1, logits), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->prefill(o.session, bad, 0, 0, logits), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->prefill(o.session, bad, 1, 0, nullptr), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->position(o.session), 0);  // nothing reached the session

  const int32_t four[4] = {0, 1, 2, 0};
  ASSERT_EQ(t->prefill(o.session, four, 3, 1, logits), TS_OK);
  EXPECT_EQ(t->prefill(o.session, four, 2, 0, logits), TS_ERR_CONTEXT_FULL);  // 3 + 2 > 4
  EXPECT_EQ(t->rewind(o.session, 4), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->rewind(o.session, -1), TS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(t->rewind(o.session, 1), TS_OK);
  EXPECT_EQ(t->position(o.session), 1);

  ts_session_options opt{sizeof(ts_session_options), TS_WEIGHTS_FULL_PRECISION, 0, 0, nullptr};
  int raw = 7;  // a weight path no enumerator names, as a C caller could pass
  std::memcpy(&opt.weight_path, &raw, sizeof raw);
  ts_session* s = nullptr;
  EXPECT_EQ(t->open_session(o.model, &opt, &s), TS_ERR_INVALID_ARGUMENT);
  opt.weight_path = TS_WEIGHTS_QUANTIZED;
  opt.n_threads = -1;
  EXPECT_EQ(t->open_session(o.model, &opt, &s), TS_ERR_INVALID_ARGUMENT);
  opt.n_threads = 0;
  opt.struct_size = 8;
  EXPECT_EQ(t->open_session(o.model, &opt, &s), TS_ERR_INVALID_ARGUMENT);
  opt.struct_size = sizeof opt;
  opt.fault = "causal_mask";
  EXPECT_EQ(t->open_session(o.model, &opt, &s), TS_ERR_UNSUPPORTED);
  EXPECT_EQ(s, nullptr);
}

TEST(BackendAdapter, ExceptionsBecomeStatuses) {
  const ts_backend* t = touchstone::BackendAdapter<Full>::table();
  Opened o(t);
  float logits[kVocab];
  const int32_t three = 3, four = 4;
  EXPECT_EQ(t->prefill(o.session, &three, 1, 0, logits), TS_ERR_INTERNAL);
  EXPECT_STREQ(t->last_error(), "token 3 breaks me");
  EXPECT_EQ(t->prefill(o.session, &four, 1, 0, logits), TS_ERR_OUT_OF_MEMORY);
  const int32_t ok = 1;
  ASSERT_EQ(t->prefill(o.session, &ok, 1, 0, logits), TS_OK);
  EXPECT_STREQ(t->last_error(), "");  // cleared on success
}

TEST(BackendAdapter, DecodeGreedyAndTapsReachTheSession) {
  const ts_backend* t = touchstone::BackendAdapter<Full>::table();
  Opened o(t, 16);
  float logits[kVocab];
  Full::decode_calls = 0;
  ASSERT_EQ(t->decode(o.session, 2, logits), TS_OK);
  EXPECT_EQ(Full::decode_calls, 1);  // its own decode, not prefill of one
  EXPECT_EQ(logits[2], 2.0f);
  int32_t tok = -1;
  const int32_t in[2] = {1, 1};
  ASSERT_EQ(t->prefill_greedy(o.session, in, 2, &tok), TS_OK);
  EXPECT_EQ(tok, (1 + 2) % kVocab);  // last position is 2
  EXPECT_EQ(t->position(o.session), 3);

  float taps[2];
  EXPECT_EQ(t->read_taps(o.session, taps, 2), TS_ERR_INVALID_ARGUMENT);  // taps off
  ASSERT_EQ(t->set_taps(o.session, 1), TS_OK);
  EXPECT_EQ(t->read_taps(o.session, taps, 3), TS_ERR_INVALID_ARGUMENT);  // wrong size
  ASSERT_EQ(t->read_taps(o.session, taps, 2), TS_OK);
  EXPECT_EQ(taps[1], 2.0f);

  const ts_backend* m = touchstone::BackendAdapter<Minimal>::table();
  Opened mo(m);
  ASSERT_EQ(m->decode(mo.session, 4, logits), TS_OK);  // prefill of one token
  EXPECT_EQ(logits[4], 4.0f);
  EXPECT_EQ(m->position(mo.session), 1);
}

// ---- ABI v6: step_batch and fork_session ----

ts_batch_entry entry(ts_session* s, const int32_t* t, int32_t n, float* out, int32_t all = 0) {
  return ts_batch_entry{sizeof(ts_batch_entry), s, t, n, all, out};
}

TEST(BackendAdapter, ServingMembersAndTheirFlags) {
  const ts_backend* t = touchstone::BackendAdapter<Batched>::table();
  EXPECT_NE(t->step_batch, nullptr);
  EXPECT_NE(t->fork_session, nullptr);
  ts_capabilities c{};
  c.struct_size = sizeof c;
  ASSERT_EQ(t->capabilities(&c), TS_OK);
  // BATCHED_SESSIONS as claimed (it has step_batch); KV_PREFIX_COPY from fork().
  EXPECT_EQ(c.flags, TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY);
  EXPECT_EQ(c.max_batch, 3);
  // A v5 caller's struct ends before the v6 fields: they are not written.
  struct {
    ts_capabilities c;
    unsigned char guard[16];
  } buf;
  std::memset(&buf, 0xAB, sizeof buf);
  buf.c.struct_size = uint32_t(TS_CAPABILITIES_V5_SIZE);
  ASSERT_EQ(t->capabilities(&buf.c), TS_OK);
  EXPECT_EQ(buf.c.struct_size, uint32_t(TS_CAPABILITIES_V5_SIZE));
  const auto* tail = reinterpret_cast<const unsigned char*>(&buf.c) + TS_CAPABILITIES_V5_SIZE;
  for (size_t i = 0; i < sizeof(ts_capabilities) - TS_CAPABILITIES_V5_SIZE; ++i)
    EXPECT_EQ(tail[i], 0xAB) << "byte " << i;
}

TEST(BackendAdapter, StepBatchGivesEachEntryItsPrefill) {
  const ts_backend* t = touchstone::BackendAdapter<Batched>::table();
  Opened a(t);
  ts_session* b = a.another();
  const int32_t two[2] = {1, 2};
  float scratch[kVocab * 2];
  ASSERT_EQ(t->prefill(a.session, two, 2, 0, scratch), TS_OK);
  float la[kVocab], lb[kVocab * 2];
  const int32_t ta = 3, tb[2] = {4, 0};
  const ts_batch_entry e[2] = {entry(a.session, &ta, 1, la), entry(b, tb, 2, lb, 1)};
  ASSERT_EQ(t->step_batch(e, 2), TS_OK) << t->last_error();
  EXPECT_EQ(t->position(a.session), 3);
  EXPECT_EQ(t->position(b), 2);
  float want[kVocab];
  fill(3, 2, want);
  EXPECT_EQ(std::memcmp(la, want, sizeof want), 0);
  fill(0, 1, want);
  EXPECT_EQ(std::memcmp(lb + kVocab, want, sizeof want), 0);
}

// Every refusal names the entry and changes no position.
TEST(BackendAdapter, StepBatchChecksNameTheEntry) {
  const ts_backend* t = touchstone::BackendAdapter<Batched>::table();
  Opened a(t), other(t);
  ts_session* b = a.another();
  float l0[kVocab], l1[kVocab], l2[kVocab], l3[kVocab];
  const int32_t ok = 1, bad = kVocab;
  auto refused = [&](std::vector<ts_batch_entry> e, ts_status want, const std::string& text) {
    const int calls = Batched::batch_calls;
    EXPECT_EQ(t->step_batch(e.data(), int32_t(e.size())), want) << text;
    EXPECT_NE(std::string(t->last_error()).find(text), std::string::npos) << t->last_error();
    EXPECT_EQ(Batched::batch_calls, calls) << text << ": the backend saw the call";
    EXPECT_EQ(t->position(a.session), 0) << text;
    EXPECT_EQ(t->position(b), 0) << text;
  };
  refused({entry(a.session, &ok, 1, l0), entry(a.session, &ok, 1, l1)}, TS_ERR_INVALID_ARGUMENT,
          "entry 1: the same session twice");
  refused({entry(a.session, &ok, 1, l0), entry(other.session, &ok, 1, l1)}, TS_ERR_INVALID_ARGUMENT,
          "entry 1: a session of another model");
  refused({entry(a.session, &ok, 1, l0), entry(b, &bad, 1, l1)}, TS_ERR_INVALID_ARGUMENT,
          "entry 1: token #0 = 5 outside [0, 5)");
  refused({entry(a.session, &ok, 1, l0), entry(b, &ok, 1, nullptr)}, TS_ERR_INVALID_ARGUMENT,
          "entry 1: prefill: null buffer");
  refused({entry(a.session, &ok, 0, l0)}, TS_ERR_INVALID_ARGUMENT, "entry 0: prefill: null buffer");
  refused({entry(a.session, &ok, 1, l0), entry(nullptr, &ok, 1, l1)}, TS_ERR_INVALID_ARGUMENT,
          "entry 1: null session");
  refused({entry(a.session, &ok, 1, l0), entry(b, &ok, 1, l1), entry(a.session, &ok, 1, l2),
           entry(b, &ok, 1, l3)},
          TS_ERR_INVALID_ARGUMENT, "4 entries, max_batch is 3");
  std::vector<ts_batch_entry> skew = {entry(a.session, &ok, 1, l0), entry(b, &ok, 1, l1)};
  skew[1].struct_size = 8;
  refused(skew, TS_ERR_INVALID_ARGUMENT, "entry 1: struct_size differs");
  EXPECT_EQ(t->step_batch(nullptr, 1), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->step_batch(skew.data(), 0), TS_ERR_INVALID_ARGUMENT);

  // Another weight path than entry 0's, and an entry with no room left.
  ts_session* q = a.another(0, TS_WEIGHTS_QUANTIZED);
  refused({entry(a.session, &ok, 1, l0), entry(q, &ok, 1, l1)}, TS_ERR_INVALID_ARGUMENT,
          "entry 1: a session of another weight path");
  const int32_t nine[9] = {};
  float big[kVocab];
  refused({entry(a.session, &ok, 1, l0), entry(b, nine, 9, big)}, TS_ERR_CONTEXT_FULL,
          "entry 1: position 0 + 9 tokens exceeds max context 8");
}

TEST(BackendAdapter, AThrowingStepBatchRollsEverySessionBack) {
  const ts_backend* t = touchstone::BackendAdapter<Batched>::table();
  Opened a(t);
  ts_session* b = a.another();
  const int32_t two[2] = {1, 2};
  float scratch[kVocab];
  ASSERT_EQ(t->prefill(a.session, two, 2, 0, scratch), TS_OK);
  float la[kVocab], lb[kVocab];
  const ts_batch_entry e[2] = {entry(a.session, two, 2, la), entry(b, two, 1, lb)};
  Batched::throw_after_advancing = true;
  EXPECT_EQ(t->step_batch(e, 2), TS_ERR_INTERNAL);
  Batched::throw_after_advancing = false;
  EXPECT_STREQ(t->last_error(), "device lost mid-batch");
  EXPECT_EQ(t->position(a.session), 2);
  EXPECT_EQ(t->position(b), 0);
}

TEST(BackendAdapter, ForkSessionChecksTheRangeAndCopiesThePrefix) {
  const ts_backend* t = touchstone::BackendAdapter<Batched>::table();
  Opened a(t);
  const int32_t three[3] = {1, 2, 3};
  float l[kVocab];
  ASSERT_EQ(t->prefill(a.session, three, 3, 0, l), TS_OK);
  ts_session* f = nullptr;
  EXPECT_EQ(t->fork_session(a.session, 4, &f), TS_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(t->last_error(), "fork_session: n_prefix 4 outside [0, 3]");
  EXPECT_EQ(t->fork_session(a.session, -1, &f), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(f, nullptr);
  EXPECT_EQ(t->fork_session(nullptr, 0, &f), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(t->fork_session(a.session, 0, nullptr), TS_ERR_INVALID_ARGUMENT);
  for (int32_t n : {0, 2, 3}) {
    ASSERT_EQ(t->fork_session(a.session, n, &f), TS_OK) << n;
    EXPECT_EQ(t->position(f), n);
    float g[kVocab];
    ASSERT_EQ(t->decode(f, 1, g), TS_OK);  // the fork advances alone
    EXPECT_EQ(t->position(a.session), 3);
    // A fork is a session like any other: it joins a batch with its source.
    const ts_batch_entry e[2] = {entry(a.session, three, 1, l), entry(f, three, 1, g)};
    ASSERT_EQ(t->step_batch(e, 2), TS_OK) << t->last_error();
    t->free_session(f);
    ASSERT_EQ(t->rewind(a.session, 3), TS_OK);
  }
}

}  // namespace
