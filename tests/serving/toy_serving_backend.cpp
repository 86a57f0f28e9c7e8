// A toy ABI v6 backend (touchstone/abi/backend_adapter.hpp) with its own step_batch
// and fork_session, for end-to-end tests of the serving calls in process and
// through the child-process protocol. Its "KV cache" is the token history and a
// row of logits hashes all of it, so a batch entry computed at the wrong
// position or a fork holding the wrong prefix gives different logits.
// Variants: TOY_OVERRUN (step_batch writes one float past entry 1's buffer),
// TOY_THROW (step_batch throws after advancing every session).
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "touchstone/abi/backend_adapter.hpp"

namespace {

constexpr int32_t kVocab = 16;

struct Toy {
  static constexpr const char* name = "toy_serving";
  static constexpr const char* version = "1";

  struct Model {
    int32_t n_vocab() const { return kVocab; }
  };
  struct Session {
    std::vector<int32_t> kv;
    int32_t max_ctx = 64;
    int32_t position() const { return int32_t(kv.size()); }
    int32_t max_context() const { return max_ctx; }
    void row(float* out) const {
      uint32_t h = 2166136261u;
      for (int32_t t : kv) h = (h ^ uint32_t(t)) * 16777619u;
      for (int32_t i = 0; i < kVocab; ++i)
        out[i] = float((h >> (i % 24)) & 0xffu) + 0.25f * float(i);
    }
    void prefill(std::span<const int32_t> t, bool all, float* logits) {
      for (size_t i = 0; i < t.size(); ++i) {
        kv.push_back(t[i]);
        if (all) row(logits + i * kVocab);
      }
      if (!all) row(logits);
    }
    void rewind(int32_t p) { kv.resize(size_t(p)); }
    std::unique_ptr<Session> fork(int32_t n_prefix) const {
      auto s = std::make_unique<Session>(*this);
      s->kv.resize(size_t(n_prefix));
      return s;
    }
  };

  static void step_batch(std::span<const touchstone::abi::BatchItem<Session>> items) {
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& it = items[i];
      it.session->prefill(it.tokens, it.all_positions, it.logits);
#ifdef TOY_OVERRUN
      if (i == 1) it.logits[(it.all_positions ? it.tokens.size() : 1) * kVocab] = 1.0f;
#endif
    }
#ifdef TOY_THROW
    throw std::runtime_error("toy step_batch fails after advancing every session");
#endif
  }

  static std::string device_name() { return "toy device"; }
  static void capabilities(ts_capabilities& c) {
    c.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BATCHED_SESSIONS | TS_CAP_BITWISE_DETERMINISM |
              TS_CAP_BATCH_INVARIANT;
    c.weight_types = TS_WEIGHT_TYPE_BIT(0);
    c.max_batch = 4;
  }
  static std::unique_ptr<Model> load_model(const std::string&) { return std::make_unique<Model>(); }
  static std::unique_ptr<Session> open_session(Model&, const ts_session_options& o) {
    auto s = std::make_unique<Session>();
    if (o.max_context > 0) s->max_ctx = o.max_context;
    return s;
  }
};

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(Toy)
