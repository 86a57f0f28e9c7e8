// embeddings_test.cpp - ABI v8 prefill_embeddings on cpu_simd against the reference.
//
// The vision-language test model (tests/models/vision: a Gemma 3 decoder and its
// mmproj) with an image's tokens from the reference's vision tower placed between text
// tokens: every position's logits on both weight paths equal the reference's
// (ReferenceTransformer::prefill_embeddings) to fp32 accumulation noise, with the image
// block attended bidirectionally or causally as asked; 1 and 3 threads agree bitwise;
// the image faults change what they should; bad calls fail with their status; ABI v9
// preprocess_image and the vision-path faults.
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "cpu_simd_backend.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/reference/reference_forward.h"
#include "touchstone/vision/image_prompt.h"
#include "touchstone/vision/vision_tower.h"

namespace {

const std::string kDir = TOUCHSTONE_TEST_MODEL_DIR "/vision";
const std::string kModel = kDir + "/gemma3vl-test-f32.gguf";
const std::vector<int32_t> kBefore = {2, 9, 3};     // BOS, a word, <start_of_image>
const std::vector<int32_t> kAfter = {4, 11, 7, 8};  // <end_of_image>, words

// The image's tokens: a deterministic pixel pattern through the reference tower.
std::vector<float> image_tokens(int32_t* n) {
  const touchstone::vision::VisionTower t =
      touchstone::vision::load_vision_tower(kDir + "/mmproj-gemma3vl-test-f32.gguf");
  const int32_t s = t.config.image_size;
  touchstone::vision::PixelValues px{3, s, s, std::vector<float>(size_t(3) * s * s)};
  for (size_t i = 0; i < px.values.size(); ++i) px.values[i] = float(std::sin(0.37 * double(i)));
  *n = t.config.n_tokens();
  return touchstone::vision::project(t, touchstone::vision::encode_patches(t, px));
}

// Every position's logits of kBefore, the image, kAfter through the reference.
std::vector<float> reference(const std::vector<float>& img, int32_t m, bool bidirectional,
                             int32_t ctx = 64) {
  const touchstone::StoredWeights w = touchstone::load_stored_weights(kModel);
  touchstone::ReferenceTransformer ref(w, ctx, 1);
  const size_t V = size_t(w.config.n_vocab), a = kBefore.size(), b = kAfter.size();
  std::vector<float> out((a + size_t(m) + b) * V);
  ref.prefill(kBefore, true, std::span(out.data(), a * V));
  ref.prefill_embeddings(img, m, bidirectional, true, std::span(out.data() + a * V, size_t(m) * V));
  ref.prefill(kAfter, true, std::span(out.data() + (a + size_t(m)) * V, b * V));
  return out;
}

struct Run {
  ts_weight_path path = TS_WEIGHTS_FULL_PRECISION;
  int threads = 1;
  const char* fault = nullptr;
  bool bidirectional = true;
  int32_t max_context = 64;
};

std::vector<float> cpu_simd(ts_model* model, const std::vector<float>& img, int32_t m, size_t V,
                            const Run& r) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  ts_session_options o{};
  o.struct_size = sizeof o;
  o.weight_path = r.path;
  o.n_threads = r.threads;
  o.max_context = r.max_context;
  o.fault = r.fault;
  ts_session* s = nullptr;
  EXPECT_EQ(api->open_session(model, &o, &s), TS_OK) << api->last_error();
  const size_t a = kBefore.size(), b = kAfter.size();
  std::vector<float> out((a + size_t(m) + b) * V);
  if (!s) return out;
  EXPECT_EQ(api->prefill(s, kBefore.data(), int32_t(a), 1, out.data()), TS_OK);
  ts_embedding_input in{sizeof(ts_embedding_input), img.data(), m, int32_t(img.size() / size_t(m)),
                        r.bidirectional ? 1 : 0};
  EXPECT_EQ(api->prefill_embeddings(s, &in, 1, out.data() + a * V), TS_OK) << api->last_error();
  EXPECT_EQ(api->position(s), int32_t(a) + m);
  EXPECT_EQ(api->prefill(s, kAfter.data(), int32_t(b), 1, out.data() + (a + size_t(m)) * V), TS_OK);
  api->free_session(s);
  return out;
}

double nmse(const std::vector<float>& x, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double{x[i]} - double{ref[i]};
    num += e * e;
    den += double{ref[i]} * double{ref[i]};
  }
  return num / den;
}

class Embeddings : public ::testing::Test {
 protected:
  void SetUp() override {
    img = image_tokens(&m);
    ASSERT_EQ(api->load_model(kModel.c_str(), &model), TS_OK) << api->last_error();
    V = size_t(api->n_vocab(model));
  }
  void TearDown() override { api->free_model(model); }
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  ts_model* model = nullptr;
  std::vector<float> img;
  int32_t m = 0;
  size_t V = 0;
};

TEST_F(Embeddings, MatchTheReferenceBidirectionalAndCausalOnBothPaths) {
  ts_capabilities caps{};
  caps.struct_size = sizeof caps;
  ASSERT_EQ(api->capabilities(&caps), TS_OK);
  EXPECT_TRUE(caps.flags & TS_CAP_EMBEDDING_INPUT);
  const std::vector<float> bidi = reference(img, m, true), causal = reference(img, m, false);
  ASSERT_GT(nmse(causal, bidi), 1e-6) << "the image block's attention rule must matter here";
  for (ts_weight_path path : {TS_WEIGHTS_FULL_PRECISION, TS_WEIGHTS_QUANTIZED}) {
    SCOPED_TRACE(path == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision");
    const std::vector<float> got = cpu_simd(model, img, m, V, {path, 1});
    EXPECT_LT(nmse(got, bidi), 1e-11);
    EXPECT_EQ(cpu_simd(model, img, m, V, {path, 3}), got);  // bitwise, any thread count
    EXPECT_LT(nmse(cpu_simd(model, img, m, V, {path, 1, nullptr, false}), causal), 1e-11);
  }
}

TEST_F(Embeddings, TheImageFaultsChangeWhatTheyName) {
  const std::vector<float> bidi = reference(img, m, true), causal = reference(img, m, false);
  // image_attended_causally: the bidirectional request computed causally.
  const std::vector<float> faulty =
      cpu_simd(model, img, m, V, {TS_WEIGHTS_FULL_PRECISION, 1, "image_attended_causally"});
  EXPECT_LT(nmse(faulty, causal), 1e-11);
  EXPECT_GT(nmse(faulty, bidi), 1e-6);
  // image_position_offset: the block rotated one position late; the text before it intact.
  const std::vector<float> off =
      cpu_simd(model, img, m, V, {TS_WEIGHTS_FULL_PRECISION, 1, "image_position_offset"});
  const size_t text = kBefore.size() * V;
  EXPECT_LT(nmse(std::vector<float>(off.begin(), off.begin() + long(text)),
                 std::vector<float>(bidi.begin(), bidi.begin() + long(text))),
            1e-11);
  EXPECT_GT(nmse(off, bidi), 1e-8);
}

// A bidirectional block longer than a forward pass's 128 tokens (a real Gemma 3 image
// has 256) is still one pass, its scratch grown: 200 rows against the reference.
TEST_F(Embeddings, ABlockLongerThanAPassMatchesTheReference) {
  constexpr int32_t kRows = 200, kCtx = 256;
  const size_t d = img.size() / size_t(m);
  std::vector<float> rows(size_t(kRows) * d);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = img[i % img.size()] * float(1 + i % 3);
  const std::vector<float> bidi = reference(rows, kRows, true, kCtx);
  ASSERT_GT(nmse(reference(rows, kRows, false, kCtx), bidi), 1e-6);
  for (ts_weight_path path : {TS_WEIGHTS_FULL_PRECISION, TS_WEIGHTS_QUANTIZED}) {
    SCOPED_TRACE(path == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision");
    const std::vector<float> got = cpu_simd(model, rows, kRows, V, {path, 1, nullptr, true, kCtx});
    EXPECT_LT(nmse(got, bidi), 1e-11);
    EXPECT_EQ(cpu_simd(model, rows, kRows, V, {path, 2, nullptr, true, kCtx}), got);
  }
}

TEST_F(Embeddings, BadCallsFailWithTheirStatus) {
  ts_session_options o{};
  o.struct_size = sizeof o;
  o.max_context = 300;
  ts_session* s = nullptr;
  ASSERT_EQ(api->open_session(model, &o, &s), TS_OK) << api->last_error();
  std::vector<float> logits(200 * V);
  const int32_t d = int32_t(img.size() / size_t(m));
  ts_embedding_input in{sizeof(ts_embedding_input), img.data(), m, d + 1, 1};
  EXPECT_EQ(api->prefill_embeddings(s, &in, 0, logits.data()), TS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(api->last_error()).find("n_embd"), std::string::npos);
  std::vector<float> big(size_t(200) * size_t(d), 0.25f);
  in = {sizeof(ts_embedding_input), big.data(), 200, d, 0};  // causally: chunks of a pass
  EXPECT_EQ(api->prefill_embeddings(s, &in, 0, logits.data()), TS_OK) << api->last_error();
  EXPECT_EQ(api->position(s), 200);
  in.n_tokens = 101;  // no room
  EXPECT_EQ(api->prefill_embeddings(s, &in, 0, logits.data()), TS_ERR_CONTEXT_FULL);
  api->free_session(s);
}

// ABI v9: preprocess_image is the processor's pixel tensor (a size query first, then the
// values), set_vision_options takes the vision-path faults only, and image_resample_filter
// changes the pixels while projector_grid_transposed changes the embeddings.
TEST_F(Embeddings, PreprocessImageAndTheVisionFaults) {
  const std::string mmproj = kDir + "/mmproj-gemma3vl-test-f32.gguf";
  ASSERT_EQ(api->load_vision(model, mmproj.c_str()), TS_OK) << api->last_error();
  touchstone::vision::Image rgb{40, 30, 3, std::vector<uint8_t>(size_t(40) * 30 * 3)};
  for (size_t i = 0; i < rgb.pixels.size(); ++i) rgb.pixels[i] = uint8_t((i * 37) % 251);
  const ts_image decoded{sizeof(ts_image), TS_IMAGE_RGB8, rgb.pixels.data(), 3, 30, 40};
  const touchstone::vision::VisionTower t = touchstone::vision::load_vision_tower(mmproj);
  const touchstone::vision::PromptImage want =
      touchstone::vision::prompt_image(rgb, t.config, mmproj);
  auto pixels = [&] {
    ts_pixel_shape shape{sizeof(ts_pixel_shape), 0, 0, 0, 0};
    EXPECT_EQ(api->preprocess_image(model, &decoded, &shape, nullptr, 0), TS_OK)
        << api->last_error();
    EXPECT_EQ(shape.n_frames, 1);
    EXPECT_EQ(shape.height, t.config.image_size);
    std::vector<float> px(size_t(shape.n_frames) * 3 * size_t(shape.height) * size_t(shape.width));
    EXPECT_EQ(api->preprocess_image(model, &decoded, &shape, px.data(), int64_t(px.size()) + 1),
              TS_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(api->preprocess_image(model, &decoded, &shape, px.data(), int64_t(px.size())), TS_OK);
    return px;
  };
  auto embeddings = [&] {
    const std::vector<float>& f = want.frames[0].values;
    const ts_image p{sizeof(ts_image),    TS_IMAGE_PIXELS_F32, f.data(), 3,
                     t.config.image_size, t.config.image_size};
    std::vector<float> e(size_t(t.config.n_tokens()) * size_t(t.config.n_embd_text));
    EXPECT_EQ(api->encode_image(model, &p, e.data(), int64_t(e.size())), TS_OK);
    return e;
  };
  EXPECT_EQ(pixels(), want.frames[0].values);
  const std::vector<float> clean = embeddings();
  ts_vision_options o{sizeof(ts_vision_options), "image_resample_filter"};
  ASSERT_EQ(api->set_vision_options(model, &o), TS_OK) << api->last_error();
  EXPECT_GT(nmse(pixels(), want.frames[0].values), 1e-5);
  EXPECT_EQ(embeddings(), clean);  // the tower is untouched
  o.fault = "projector_grid_transposed";
  ASSERT_EQ(api->set_vision_options(model, &o), TS_OK);
  EXPECT_EQ(pixels(), want.frames[0].values);
  EXPECT_GT(nmse(embeddings(), clean), 1e-2);
  o.fault = "image_attended_causally";  // a session's fault
  EXPECT_EQ(api->set_vision_options(model, &o), TS_ERR_UNSUPPORTED);
  EXPECT_EQ(api->set_vision_options(model, nullptr), TS_OK);  // the defaults again
  EXPECT_EQ(embeddings(), clean);
  ts_session_options so{};
  so.struct_size = sizeof so;
  so.fault = "image_resample_filter";  // a vision-path fault is no session's
  ts_session* s = nullptr;
  EXPECT_EQ(api->open_session(model, &so, &s), TS_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(api->last_error()).find("set_vision_options"), std::string::npos);
}

}  // namespace
