// BackendAdapter's ABI v8 members (touchstone/abi/backend_adapter.hpp): Session::n_embd +
// prefill_embeddings become prefill_embeddings and TS_CAP_EMBEDDING_INPUT, Model::
// load_vision + encode_image the other two and TS_CAP_MULTIMODAL; the adapter's checks
// (pointers, struct_size, n_embd, room, a grammar set) run before the backend sees a call.
// A toy backend whose logits row is the mean of the embedding rows it was given.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "touchstone/abi/backend_adapter.hpp"

namespace {

constexpr int32_t kVocab = 4, kEmbd = 4;

class AnyToken final : public touchstone::abi::GrammarState {
 public:
  bool accept(int32_t) override { return true; }
  void rollback(int32_t) override {}
  void mask(uint32_t* words, int32_t) const override { words[0] = 0xfu; }
  std::unique_ptr<GrammarState> clone() const override { return std::make_unique<AnyToken>(); }
};

struct Seeing {
  static constexpr const char* name = "seeing";
  static constexpr const char* version = "8";
  struct Model {
    std::string tower;  // the mmproj path given to load_vision ("" = none)
    int32_t n_vocab() const { return kVocab; }
    void load_vision(const std::string& path) { tower = path; }
    void encode_image(const ts_image& img, float* out, int64_t n) {
      if (tower.empty()) throw touchstone::abi::StatusError(TS_ERR_INVALID_ARGUMENT, "no tower");
      const float* px = static_cast<const float*>(img.data);
      for (int64_t i = 0; i < n; ++i) out[i] = px[i % (3 * img.height * img.width)];
    }
  };
  struct Session {
    int32_t pos = 0;
    bool last_bidirectional = false;
    int32_t position() const { return pos; }
    int32_t max_context() const { return 8; }
    int32_t n_embd() const { return kEmbd; }
    void prefill(std::span<const int32_t> t, bool, float* logits) {
      pos += int32_t(t.size());
      for (int32_t v = 0; v < kVocab; ++v) logits[v] = 0.0f;
    }
    void prefill_embeddings(const float* e, int32_t n, bool bidirectional, bool all,
                            float* logits) {
      last_bidirectional = bidirectional;
      for (int32_t r = 0; r < (all ? n : 1); ++r)
        for (int32_t v = 0; v < kVocab; ++v)
          logits[r * kVocab + v] = e[(all ? r : n - 1) * kEmbd + v];
      pos += n;
    }
    void rewind(int32_t p) { pos = p; }
    std::unique_ptr<touchstone::abi::GrammarState> compile_grammar(const ts_grammar&) {
      return std::make_unique<AnyToken>();
    }
  };
  static std::string device_name() { return "toy"; }
  static void capabilities(ts_capabilities& c) { c.flags = TS_CAP_ALL_POSITION_LOGITS; }
  static std::unique_ptr<Model> load_model(const std::string&) { return std::make_unique<Model>(); }
  static std::unique_ptr<Session> open_session(Model&, const ts_session_options&) {
    return std::make_unique<Session>();
  }
};

struct Fixture {
  const ts_backend* t = touchstone::BackendAdapter<Seeing>::table();
  ts_model* m = nullptr;
  ts_session* s = nullptr;
  Fixture() {
    EXPECT_EQ(t->load_model("x.gguf", &m), TS_OK);
    ts_session_options o{};
    o.struct_size = sizeof o;
    EXPECT_EQ(t->open_session(m, &o, &s), TS_OK);
  }
  ~Fixture() {
    t->free_session(s);
    t->free_model(m);
  }
};

TEST(AdapterMultimodal, MembersAndFlagsFollowTheClass) {
  Fixture f;
  EXPECT_EQ(f.t->api_version, uint32_t(TS_BACKEND_API_VERSION));
  ASSERT_NE(f.t->prefill_embeddings, nullptr);
  ASSERT_NE(f.t->load_vision, nullptr);
  ASSERT_NE(f.t->encode_image, nullptr);
  ts_capabilities c{};
  c.struct_size = sizeof c;
  ASSERT_EQ(f.t->capabilities(&c), TS_OK);
  EXPECT_TRUE(c.flags & TS_CAP_EMBEDDING_INPUT);
  EXPECT_TRUE(c.flags & TS_CAP_MULTIMODAL);
}

TEST(AdapterMultimodal, EmbeddingsAppendAndReturnTheirRows) {
  Fixture f;
  const std::vector<float> e = {1, 2, 3, 4, 5, 6, 7, 8};  // 2 rows of 4
  ts_embedding_input in{sizeof in, e.data(), 2, kEmbd, 1};
  std::vector<float> logits(2 * kVocab);
  ASSERT_EQ(f.t->prefill_embeddings(f.s, &in, 1, logits.data()), TS_OK) << f.t->last_error();
  EXPECT_EQ(logits, e);
  EXPECT_EQ(f.t->position(f.s), 2);
  ASSERT_EQ(f.t->prefill_embeddings(f.s, &in, 0, logits.data()), TS_OK);
  EXPECT_EQ(std::vector<float>(logits.begin(), logits.begin() + kVocab),
            std::vector<float>(e.begin() + kEmbd, e.end()));  // the last row only
  EXPECT_EQ(f.t->position(f.s), 4);
}

TEST(AdapterMultimodal, BadEmbeddingCallsMoveNothing) {
  Fixture f;
  const std::vector<float> e(8 * kEmbd, 0.5f);
  std::vector<float> logits(8 * kVocab);
  ts_embedding_input in{sizeof in, e.data(), 2, kEmbd + 1, 0};
  EXPECT_EQ(f.t->prefill_embeddings(f.s, &in, 0, logits.data()), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(f.t->last_error()).find("n_embd 5"), std::string::npos);
  in = {sizeof in, e.data(), 0, kEmbd, 0};
  EXPECT_EQ(f.t->prefill_embeddings(f.s, &in, 0, logits.data()), TS_ERR_INVALID_ARGUMENT);
  in = {sizeof in - 4, e.data(), 2, kEmbd, 0};
  EXPECT_EQ(f.t->prefill_embeddings(f.s, &in, 0, logits.data()), TS_ERR_INVALID_ARGUMENT);
  in = {sizeof in, e.data(), 9, kEmbd, 0};  // max_context 8
  EXPECT_EQ(f.t->prefill_embeddings(f.s, &in, 0, logits.data()), TS_ERR_CONTEXT_FULL);
  EXPECT_EQ(f.t->prefill_embeddings(f.s, nullptr, 0, logits.data()), TS_ERR_INVALID_ARGUMENT);
  ts_grammar g{sizeof g, TS_GRAMMAR_GBNF, "root ::= \"a\""};
  ASSERT_EQ(f.t->set_grammar(f.s, &g), TS_OK);
  in = {sizeof in, e.data(), 2, kEmbd, 0};
  EXPECT_EQ(f.t->prefill_embeddings(f.s, &in, 0, logits.data()), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(f.t->last_error()).find("grammar"), std::string::npos);
  EXPECT_EQ(f.t->position(f.s), 0);
}

TEST(AdapterMultimodal, EncodeImageChecksTheImageThenAsksTheModel) {
  Fixture f;
  const std::vector<float> px(3 * 2 * 2, 0.25f);
  std::vector<float> out(2 * kEmbd, -1.0f);
  ts_image img{sizeof img, TS_IMAGE_PIXELS_F32, px.data(), 3, 2, 2};
  EXPECT_EQ(f.t->encode_image(f.m, &img, out.data(), int64_t(out.size())),
            TS_ERR_INVALID_ARGUMENT);  // no tower yet: the model's own check
  ASSERT_EQ(f.t->load_vision(f.m, "mmproj.gguf"), TS_OK);
  ASSERT_EQ(f.t->encode_image(f.m, &img, out.data(), int64_t(out.size())), TS_OK);
  EXPECT_EQ(out, std::vector<float>(2 * kEmbd, 0.25f));
  img.channels = 4;
  EXPECT_EQ(f.t->encode_image(f.m, &img, out.data(), int64_t(out.size())), TS_ERR_INVALID_ARGUMENT);
  img.channels = 3;
  const int bad = 7;  // no enumerator: set through its bytes
  std::memcpy(&img.format, &bad, sizeof bad);
  EXPECT_EQ(f.t->encode_image(f.m, &img, out.data(), int64_t(out.size())), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(f.t->last_error()).find("format"), std::string::npos);
  img = {sizeof img, TS_IMAGE_PIXELS_F32, nullptr, 3, 2, 2};
  EXPECT_EQ(f.t->encode_image(f.m, &img, out.data(), int64_t(out.size())), TS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(f.t->load_vision(f.m, nullptr), TS_ERR_INVALID_ARGUMENT);
}

}  // namespace
