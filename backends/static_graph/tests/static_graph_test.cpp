// Unit tests of the static_graph backend: bucket planning, the in-place KV
// proof on the lowered IR, and real-model checks (reference agreement, a
// prompt crossing a bucket boundary, rewind, prefill vs decode).
#include <gtest/gtest.h>

#include "touchstone/test_model.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "compiler.h"
#include "engine.h"
#include "graph.h"
#include "touchstone/model/gguf.h"
#include "touchstone/reference/reference_forward.h"

namespace sg = touchstone::static_graph;

namespace {

std::string model_path() { return touchstone::test::real_model_path(); }

sg::ModelDims tiny_dims() { return sg::ModelDims{2, 64, 128, 4, 2, 16, 100, 1e-5f}; }

double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

}  // namespace

TEST(StaticGraphBuckets, SmallestBucketThatFits) {
  sg::BucketConfig b;
  b.prefill = {16, 64};
  b.windows = {256};
  auto p = sg::plan_prefill(0, 10, 2048, b);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].T, 16);
  EXPECT_EQ(p[0].n, 10);
  EXPECT_EQ(p[0].W, 256);
  p = sg::plan_prefill(0, 1, 2048, b);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].T, 1);
}

TEST(StaticGraphBuckets, LongPromptIsChunked) {
  sg::BucketConfig b;
  b.prefill = {16, 64};
  b.windows = {256};
  auto p = sg::plan_prefill(0, 150, 2048, b);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].T, 64);
  EXPECT_EQ(p[1].T, 64);
  EXPECT_EQ(p[2].T, 64);  // 22 left: smallest bucket >= 22
  EXPECT_EQ(p[2].n, 22);
  EXPECT_EQ(p[2].start, 128);
  EXPECT_EQ(p[2].W, 256);
  int total = 0;
  for (auto& c : p) total += c.n;
  EXPECT_EQ(total, 150);
}

TEST(StaticGraphBuckets, PaddingNeverRunsPastCapacity) {
  sg::BucketConfig b;
  b.prefill = {16, 64};
  b.windows = {};
  auto p = sg::plan_prefill(100, 20, 128, b);  // a 64 bucket at 100 would write rows up to 163
  for (auto& c : p) {
    EXPECT_LE(100 + c.start + c.T, 128);
    EXPECT_EQ(c.W, 128);
  }
}

// The KV caches are function arguments updated in place: after bufferization
// the function returns nothing, takes exactly two extra out-params (logits,
// layer taps), and no buffer of the cache's size is allocated or copied.
TEST(StaticGraphIR, KvCacheUpdatedInPlace) {
  sg::GraphSpec spec;
  spec.T = 4;
  spec.W = 32;
  spec.capacity = 32;
  const sg::ModelDims D = tiny_dims();
  sg::BuiltGraph g = sg::build_step_graph(D, spec, "step");
  const std::string ir = sg::lower_to_buffers(g.mlir, sg::CompileOptions{});
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      ir, m, std::regex(R"(func\.func @step\(([^)]*)\)( -> \([^)]*\)| -> [^ ]+)? attributes)")));
  EXPECT_FALSE(m[2].matched) << "the function still returns values: " << m[0];
  const std::string sig = m[1];
  size_t n_args = 0;
  for (size_t p = sig.find("memref<"); p != std::string::npos; p = sig.find("memref<", p + 1))
    ++n_args;
  EXPECT_EQ(n_args, g.args.size() + 2);
  // Per-layer caches: K [1, KVH*hd*CAP, 1], V [1, KVH*CAP, hd].
  const int64_t kc_elems = int64_t(D.n_head_kv) * D.head_dim * spec.capacity;
  const std::string kc_type = "memref<1x" + std::to_string(kc_elems) + "x1xf32>";
  const std::string vc_type = "memref<1x" + std::to_string(int64_t(D.n_head_kv) * spec.capacity) +
                              "x" + std::to_string(D.head_dim) + "xf32>";
  // Every layer function must not return its caches either.
  EXPECT_EQ(std::regex_search(
                ir, std::regex(R"(func\.func private @layer_\d+\([^)]*\) -> \([^)]*memref<1x)" +
                               std::to_string(kc_elems) + "x1xf32>")),
            false)
      << "a layer function still returns its K cache";
  EXPECT_NE(sig.find(kc_type), std::string::npos);
  for (const std::string& t : {kc_type, vc_type}) {
    EXPECT_EQ(ir.find("memref.alloc() : " + t), std::string::npos)
        << "a copy of the KV cache is allocated";
    EXPECT_EQ(ir.find("memref.alloca() : " + t), std::string::npos);
    EXPECT_EQ(
        std::regex_search(
            ir, std::regex("memref.copy [^\\n]*" +
                           std::regex_replace(t, std::regex(R"([<>])"), "\\$&") + "[^\\n]* to ")),
        false)
        << "the KV cache is copied";
  }
}

// The tiny model's step graph with Q4_1 layers and a Q8_0 embedding, T tokens.
static sg::BuiltGraph tiny_q4_1_graph(int32_t T) {
  sg::GraphSpec spec;
  spec.T = T;
  spec.W = 32;
  spec.capacity = 32;
  spec.mode = sg::WeightMode::Quantized;
  const sg::ModelDims D = tiny_dims();
  spec.layer_formats.assign(size_t(D.n_layer) * sg::kLayerMatrices, sg::MatrixFormat::Q4_1);
  spec.embd_format = sg::MatrixFormat::Q8_0;
  return sg::build_step_graph(D, spec, "step");
}

// The 4-bit path's dequantization is fused into the tiled matmuls: after
// bufferization no buffer holds a dequantized matrix ([nb][2][16][N] fp32 with
// N > one column tile), only per-tile buffers of one block x 16 or 8 columns.
TEST(StaticGraphIR, QuantizedDequantizationIsFused) {
  sg::BuiltGraph g = tiny_q4_1_graph(4);
  const std::string ir = sg::lower_to_buffers(g.mlir, sg::CompileOptions{});
  const std::regex full(R"(memref\.alloc(a)?\(\)[^\n]*: memref<(\d+)x2x16x(\d+)xf32>)");
  int tiles = 0;
  for (auto it = std::sregex_iterator(ir.begin(), ir.end(), full); it != std::sregex_iterator();
       ++it) {
    EXPECT_EQ(std::stoll((*it)[2]), 1) << "a dequantized matrix is materialised: " << (*it)[0];
    EXPECT_LE(std::stoll((*it)[3]), 16) << "a dequantized matrix is materialised: " << (*it)[0];
    ++tiles;
  }
  EXPECT_GT(tiles, 0) << "no dequantized tile buffer: was the fusion applied?";
}

// The decode graph (T = 1): the 4-bit matrix-vector products dequantize
// straight into the FMAs' registers: after bufferization no buffer holds a
// dequantized tile (one block or half-block x 1, 2 or 4 vector widths of
// columns; the M > 1 matmuls above have one), and the packed nibbles are read
// as vectors.
TEST(StaticGraphIR, QuantizedDecodeDequantizesInRegisters) {
  sg::BuiltGraph g = tiny_q4_1_graph(1);
  for (const bool parallel : {false, true}) {
    sg::CompileOptions opt;
    opt.parallel = parallel;
    const std::string ir = sg::lower_to_buffers(g.mlir, opt);
    std::smatch m;
    EXPECT_FALSE(std::regex_search(
        ir, m, std::regex(R"(memref\.alloca?\(\)[^\n]*: memref<1x[12]x16x(8|16|32|64)xf32>)")))
        << (parallel ? "parallel" : "sequential") << ": dequantized tile in memory: " << m[0];
    EXPECT_TRUE(std::regex_search(ir, std::regex(R"(vector<[0-9x]*xi8>)")))
        << "packed nibbles not vectorized";
  }
}

namespace {
// Arguments of the lowered @step (memrefs), or -1 when it still returns values.
int lowered_step_args(const std::string& ir) {
  std::smatch m;
  if (!std::regex_search(
          ir, m,
          std::regex(R"(func\.func @step\(([^)]*)\)( -> \([^)]*\)| -> [^ ]+)? attributes)")) ||
      m[2].matched) {
    return -1;
  }
  const std::string sig = m[1];
  int n = 0;
  for (size_t p = sig.find("memref<"); p != std::string::npos; p = sig.find("memref<", p + 1)) ++n;
  return n;
}
}  // namespace

// Every graph-side fault (test only, GraphFaults) changes the graph text, hence
// the on-disk cache key, and still lowers with the KV caches updated in place
// (two out-params: the logits and the layer taps); on the 4-bit path the split matmuls of
// thread_order_reduction keep their dequantization fused. A default
// GraphFaults builds the text of a spec without faults (checked byte for byte
// against the pre-fault builder when the faults were added).
TEST(StaticGraphIR, GraphFaultsChangeTheTextAndLower) {
  // tiny_dims() with 4-block rows (n_embd 128): each of 2 slices is >= 2 blocks,
  // the shape of a real model's slices.
  const sg::ModelDims D{2, 128, 256, 4, 2, 32, 100, 1e-5f};
  const std::vector<std::pair<const char*, void (*)(sg::GraphFaults&)>> faults = {
      {"rope_layout", [](sg::GraphFaults& f) { f.rope_layout = true; }},
      {"kv_position_off_by_one", [](sg::GraphFaults& f) { f.kv_off_by_one = true; }},
      {"kv_write_next", [](sg::GraphFaults& f) { f.kv_write_next = true; }},
      {"gqa_mapping", [](sg::GraphFaults& f) { f.gqa_mapping = true; }},
      {"attention_scale", [](sg::GraphFaults& f) { f.attention_scale = true; }},
      {"softmax_no_max", [](sg::GraphFaults& f) { f.softmax_no_max = true; }},
      {"rms_eps_10x", [](sg::GraphFaults& f) { f.rms_eps_scale = 10.0; }},
      {"fp16_accumulation", [](sg::GraphFaults& f) { f.fp16_accumulation = true; }},
      {"causal_mask", [](sg::GraphFaults& f) { f.causal_mask = true; }},
      {"last_layer_skipped", [](sg::GraphFaults& f) { f.last_layer_skipped = true; }},
      {"rewind_noop", [](sg::GraphFaults& f) { f.kv_len_input = true; }},
      {"thread_order_reduction", [](sg::GraphFaults& f) { f.reduction_slices = 2; }},
  };
  for (const sg::WeightMode mode : {sg::WeightMode::FullPrecision, sg::WeightMode::Quantized}) {
    sg::GraphSpec spec;
    spec.T = 4;
    spec.W = 32;
    spec.capacity = 32;
    spec.mode = mode;
    if (mode == sg::WeightMode::Quantized) {
      // Two layer signatures (two outlined functions): with 2 slices, > 20
      // quantized matmuls in the schedule (their ids must not collide there).
      spec.layer_formats.assign(size_t(D.n_layer) * sg::kLayerMatrices, sg::MatrixFormat::Q4_1);
      spec.layer_formats[sg::kLayerMatrices] = sg::MatrixFormat::Q4_0;
      spec.embd_format = sg::MatrixFormat::Q8_0;
    }
    const std::string base = sg::build_step_graph(D, spec, "step").mlir;
    for (const auto& [name, set] : faults) {
      SCOPED_TRACE(std::string(name) + (mode == sg::WeightMode::Quantized ? " quantized" : ""));
      spec.faults = sg::GraphFaults{};
      set(spec.faults);
      ASSERT_TRUE(spec.faults.any());
      const sg::BuiltGraph g = sg::build_step_graph(D, spec, "step");
      EXPECT_NE(g.mlir, base);
      const std::string ir = sg::lower_to_buffers(g.mlir, sg::CompileOptions{});
      EXPECT_EQ(lowered_step_args(ir), int(g.args.size()) + 2);
      if (mode == sg::WeightMode::Quantized && spec.faults.reduction_slices > 1) {
        // [blocks >= 2][2][16][columns >= 10] (RoPE's [T][heads][16][1] halves do not count)
        std::smatch mm;
        EXPECT_FALSE(std::regex_search(
            ir, mm,
            std::regex(R"(memref\.alloc(a)?\(\)[^\n]*: memref<([2-9]|\d\d+)x2x16x\d\d+xf32>)")))
            << "a dequantized slice is materialised: " << mm[0];
      }
    }
  }
}

// The K-quant layouts (Q4_K as Q4_1F: f32 scale and min per 32-row
// sub-block; Q6_K as Q8_16F: 16-row sub-blocks) take the same fused schedule:
// no dequantized matrix ([blocks > 1][2][16][N] or [blocks > 1][16][N] fp32
// with N > one column tile) is materialised, in a prefill or a decode graph.
TEST(StaticGraphIR, KQuantDequantizationIsFused) {
  for (const int32_t T : {1, 4}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    sg::GraphSpec spec;
    spec.T = T;
    spec.W = 32;
    spec.capacity = 32;
    spec.mode = sg::WeightMode::Quantized;
    const sg::ModelDims D = tiny_dims();
    spec.layer_formats.assign(size_t(D.n_layer) * sg::kLayerMatrices, sg::MatrixFormat::Q4_1F);
    for (int32_t l = 0; l < D.n_layer; ++l)
      spec.layer_formats[size_t(l * sg::kLayerMatrices + sg::kFfnDown)] = sg::MatrixFormat::Q8_16F;
    spec.embd_format = sg::MatrixFormat::Q8_0;
    const sg::BuiltGraph g = sg::build_step_graph(D, spec, "step");
    const std::string ir = sg::lower_to_buffers(g.mlir, sg::CompileOptions{});
    const std::regex whole(R"(memref\.alloca?\(\)[^\n]*: memref<(\d+)x(2x)?16x(\d+)xf32>)");
    for (auto it = std::sregex_iterator(ir.begin(), ir.end(), whole); it != std::sregex_iterator();
         ++it) {
      EXPECT_FALSE(std::stoll((*it)[1]) > 1 && std::stoll((*it)[3]) > 16)
          << "a dequantized matrix is materialised: " << (*it)[0];
    }
    EXPECT_EQ(lowered_step_args(ir), int(g.args.size()) + 2);
  }
}

class StaticGraphModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    model_ = sg::load_model(model_path()).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found: " << model_path();
  }
  static sg::GraphModel* model_;
};
sg::GraphModel* StaticGraphModel::model_ = nullptr;

// The capacity `touchstone parity` opens its sessions with for these short
// prompts (the planned positions rounded up to 1024, cmd_parity.cpp): the same
// graphs, hence the same cached objects, as the parity CTests.
constexpr int32_t kCap = 1024;

TEST_F(StaticGraphModel, DecodeMatchesReference) {
  const touchstone::StoredWeights w = touchstone::load_stored_weights(model_path());
  touchstone::ReferenceTransformer ref(w, 64, 2);
  sg::GraphSession s(*model_, sg::WeightMode::FullPrecision, kCap, 1);
  const int32_t V = model_->dims.n_vocab;
  std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
  for (int32_t tok : {1, 504, 3458, 282, 253, 2115}) {
    ref.forward(tok, a);
    s.decode(tok, b.data());
    EXPECT_LT(max_abs_diff(a.data(), b.data(), size_t(V)), 5e-3) << "position " << s.position() - 1;
  }
}

TEST_F(StaticGraphModel, PrefillAcrossBucketBoundaryMatchesDecode) {
  sg::GraphSession p(*model_, sg::WeightMode::FullPrecision, kCap, 1);
  sg::GraphSession d(*model_, sg::WeightMode::FullPrecision, kCap, 1);
  const int32_t V = model_->dims.n_vocab;
  std::vector<int32_t> toks;
  for (int i = 0; i < 21; ++i)
    toks.push_back(100 + 37 * i);  // 21 tokens: a 16 bucket, then 5 in a padded 16 bucket
  std::vector<float> all(size_t(V) * toks.size()), row(static_cast<size_t>(V));
  p.buckets.prefill = {16};
  p.prefill(toks.data(), int32_t(toks.size()), true, all.data());
  EXPECT_EQ(p.position(), 21);
  double worst = 0;
  for (size_t i = 0; i < toks.size(); ++i) {
    d.decode(toks[i], row.data());
    worst = std::max(worst, max_abs_diff(row.data(), all.data() + i * size_t(V), size_t(V)));
  }
  EXPECT_LT(worst, 1e-3);
  // And the next decode step agrees.
  std::vector<float> r1(static_cast<size_t>(V)), r2(static_cast<size_t>(V));
  p.decode(7, r1.data());
  d.decode(7, r2.data());
  EXPECT_LT(max_abs_diff(r1.data(), r2.data(), size_t(V)), 1e-3);
}

TEST_F(StaticGraphModel, RewindReproducesLogits) {
  sg::GraphSession s(*model_, sg::WeightMode::FullPrecision, kCap, 1);
  const int32_t V = model_->dims.n_vocab;
  std::vector<int32_t> toks{1, 504, 3458, 282, 253};
  std::vector<float> first(static_cast<size_t>(V)), again(static_cast<size_t>(V)),
      other(static_cast<size_t>(V));
  s.prefill(toks.data(), 5, false, first.data());
  s.decode(11, other.data());
  s.decode(12, other.data());
  s.rewind(4);
  s.decode(253, again.data());  // position 4 again
  EXPECT_EQ(max_abs_diff(first.data(), again.data(), size_t(V)), 0.0);
}

// The matmuls run in parallel column strips (OpenMP) whose width is fixed at
// compile time, and no reduction is split: the logits of a prefill and a few
// decode steps are bitwise the same on 1 thread (the sequential pipeline) and
// on 2 and 3 threads (the parallel one; 3 splits the strips unevenly), on both
// weight paths.
TEST_F(StaticGraphModel, ThreadCountDoesNotChangeLogits) {
  if (sg::openmp_runtime().empty()) {
    std::fprintf(stderr, "note: OpenMP runtime not found, graphs run on one thread\n");
  }
  const int32_t V = model_->dims.n_vocab;
  const std::vector<int32_t> toks{1, 504, 3458, 282, 253, 2115, 30, 987};
  for (const sg::WeightMode mode : {sg::WeightMode::FullPrecision, sg::WeightMode::Quantized}) {
    std::vector<std::vector<float>> runs;
    for (const int threads : {1, 2, 3}) {
      sg::GraphSession s(*model_, mode, kCap, threads);
      std::vector<float> out(size_t(V) * (toks.size() + 3));
      s.prefill(toks.data(), int32_t(toks.size()), true, out.data());
      for (int i = 0; i < 3; ++i)
        s.decode(int32_t(7 + 100 * i), out.data() + (toks.size() + size_t(i)) * size_t(V));
      runs.push_back(std::move(out));
    }
    for (size_t r = 1; r < runs.size(); ++r) {
      const bool same =
          std::memcmp(runs[0].data(), runs[r].data(), runs[0].size() * sizeof(float)) == 0;
      EXPECT_TRUE(same) << (mode == sg::WeightMode::Quantized ? "quantized" : "full_precision")
                        << ": logits differ between 1 and " << r + 1 << " threads, max |diff| "
                        << max_abs_diff(runs[0].data(), runs[r].data(), runs[0].size());
    }
  }
}
