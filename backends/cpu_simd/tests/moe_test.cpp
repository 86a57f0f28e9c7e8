// moe_test.cpp - cpu_simd computes the mixture-of-experts families (Mixtral-style:
// llama + expert_count; Qwen3-MoE; gpt-oss) like the reference (moe_feed_forward):
//  * tiny random models (model/core/tests/tiny_family.h, F32 matrices: the
//    quantized path's matvec, full precision's sgemm) and the converted test models
//    of tests/models/moe (GGUF blocks: Q4_0, Q8_0, Q4_K with Q5_0 experts, Q6_K, F16)
//    and tests/models/gpt-oss (F32, F16, Q8_0, MXFP4 experts: 12 tokens cross its
//    8-token sliding window) against ReferenceTransformer, prefill and decode,
//    1 == 3 threads bitwise;
//  * what the reference refuses (sigmoid routers, shared experts) is refused;
//  * step_batch == each session alone, bitwise, on the quantized path (batch
//    invariance: tokens grouped by expert see the same operations as alone), with
//    fp32 activations and with int8 activations at every int8 level this CPU runs
//    (the row-interleaved experts on AVX-512 VNNI, which hold every expert).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu_simd_backend.h"
#include "engine.h"
#include "kernels.h"
#include "tiny_family.h"
#include "touchstone/abi/backend_abi.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/model_weights.h"
#include "touchstone/reference/reference_forward.h"

namespace {

namespace gg = touchstone::gguf;
using touchstone::testing::TinyOptions;

const std::vector<int32_t> kTokens = {1, 7, 3, 31, 0, 12, 12, 5, 20, 9, 2, 17};

struct Model {
  std::string name;
  std::string path;
};

// Tiny models (tiny_family.h moe_variants): Mixtral-style and Qwen3-MoE, renormalised
// and not.
std::vector<std::pair<std::string, TinyOptions>> tiny_cases() {
  return touchstone::testing::moe_variants();
}

// The converted test models kept as GGUF blocks (skipped when the directory is absent).
std::vector<Model> file_cases() {
  std::vector<Model> out;
  const std::string moe = TOUCHSTONE_MOE_MODEL_DIR, gptoss = TOUCHSTONE_GPTOSS_MODEL_DIR;
  for (const auto& [dir, m] :
       {std::pair{moe, "mixtral-test-q4_0"}, std::pair{moe, "mixtral-test-q4_k"},
        std::pair{moe, "qwen3moe-test-q8_0"}, std::pair{moe, "qwen3moe-test-q6_k"},
        std::pair{moe, "qwen3moe-test-f16"}, std::pair{gptoss, "gptoss-test-f32"},
        std::pair{gptoss, "gptoss-test-f16"}, std::pair{gptoss, "gptoss-test-q8_0"},
        std::pair{gptoss, "gptoss-test-mxfp4"}}) {
    const std::string p = dir + "/" + m + ".gguf";
    if (std::filesystem::exists(p)) out.push_back({m, p});
  }
  return out;
}

std::vector<float> reference_logits(const std::string& path) {
  const touchstone::StoredWeights w = touchstone::load_stored_weights(path);
  touchstone::ReferenceTransformer ref(w, 64, 1);
  const size_t V = size_t(w.config.n_vocab);
  std::vector<float> out(kTokens.size() * V);
  for (size_t i = 0; i < kTokens.size(); ++i)
    ref.forward(kTokens[i], std::span<float>(out.data() + i * V, V));
  return out;
}

ts_session* open(ts_model* model, ts_weight_path path, int threads) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  ts_session_options o{};
  o.struct_size = sizeof(o);
  o.weight_path = path;
  o.n_threads = threads;
  o.max_context = 64;
  ts_session* s = nullptr;
  EXPECT_EQ(api->open_session(model, &o, &s), TS_OK) << api->last_error();
  return s;
}

// Logits of every position: one all-position prefill, or decode steps.
std::vector<float> run(ts_model* model, ts_weight_path path, int threads, bool prefill, size_t V) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  std::vector<float> out(kTokens.size() * V);
  ts_session* s = open(model, path, threads);
  if (!s) return out;
  if (prefill) {
    EXPECT_EQ(api->prefill(s, kTokens.data(), int32_t(kTokens.size()), 1, out.data()), TS_OK);
  } else {
    for (size_t i = 0; i < kTokens.size(); ++i)
      EXPECT_EQ(api->decode(s, kTokens[i], out.data() + i * V), TS_OK);
  }
  api->free_session(s);
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double nmse_max,
                  const char* what) {
  double num = 0, den = 0, max_abs = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " " << i;
    const double e = double{got[i]} - double{ref[i]};
    num += e * e;
    den += double{ref[i]} * double{ref[i]};
    max_abs = std::max(max_abs, std::fabs(e));
  }
  EXPECT_GT(den, 0.0);
  EXPECT_LT(num / den, nmse_max) << what << ": NMSE vs reference";
  EXPECT_LT(max_abs, 1e-3) << what << ": max |difference|";
}

// Both paths against the reference; 3 threads == 1 thread; quantized prefill ==
// decode bitwise (the F32 and block kernels' per-token operations).
void check_against_reference(const std::string& path, double nmse_max) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  const std::vector<float> ref = reference_logits(path);
  ts_model* model = nullptr;
  ASSERT_EQ(api->load_model(path.c_str(), &model), TS_OK) << api->last_error();
  const size_t V = size_t(api->n_vocab(model));
  for (ts_weight_path p : {TS_WEIGHTS_FULL_PRECISION, TS_WEIGHTS_QUANTIZED}) {
    SCOPED_TRACE(p == TS_WEIGHTS_QUANTIZED ? "quantized" : "full_precision");
    const std::vector<float> pre = run(model, p, 1, true, V);
    const std::vector<float> dec = run(model, p, 1, false, V);
    expect_close(pre, ref, nmse_max, "prefill");
    expect_close(dec, ref, nmse_max, "decode");
    EXPECT_EQ(run(model, p, 3, true, V), pre) << "prefill, 3 threads";
    EXPECT_EQ(run(model, p, 3, false, V), dec) << "decode, 3 threads";
    if (p == TS_WEIGHTS_QUANTIZED) {
      EXPECT_EQ(pre, dec) << "quantized prefill == decode";
    }
  }
  api->free_model(model);
}

TEST(Moe, TinyModelsMatchTheReferenceOnBothPaths) {
  for (const auto& [name, o] : tiny_cases()) {
    SCOPED_TRACE(name);
    gg::testing::TempFile f(touchstone::testing::tiny_model(o), "moe_" + name);
    const touchstone::ModelConfig cfg = touchstone::read_model_config(gg::File::open(f.path()));
    ASSERT_TRUE(cfg.is_moe());
    EXPECT_EQ(cfg.moe.norm_topk, o.expert_weights_norm != 0);
    check_against_reference(f.path(), 1e-11);
  }
}

// GGUF blocks (the test models' router is F32): NMSE as the K-quant model's
// (KQuantModel: quantized == full precision up to fp32 summation order).
TEST(Moe, TestModelsMatchTheReferenceOnBothPaths) {
  const std::vector<Model> files = file_cases();
  if (files.empty()) GTEST_SKIP() << "no test models in " << TOUCHSTONE_MOE_MODEL_DIR;
  for (const Model& m : files) {
    SCOPED_TRACE(m.name);
    check_against_reference(m.path, 1e-10);
  }
}

// What the reference refuses, cpu_simd refuses too, naming it (read_model_config):
// a sigmoid router's key, a shared expert's tensor, a dense FFN beside the experts.
TEST(Moe, OtherRoutersAndSharedExpertsAreRefused) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  TinyOptions gating;
  gating.arch = "qwen3moe";
  gating.n_expert = 4;
  gating.extra_string_key = "qwen3moe.expert_gating_func";
  TinyOptions shared = gating;
  shared.extra_string_key.clear();
  shared.extra_tensor = "blk.0.ffn_gate_inp_shexp.weight";
  TinyOptions dense;
  dense.n_expert = 4;
  dense.extra_tensor = "blk.0.ffn_gate.weight";
  for (const auto& [o, name] : {std::pair{gating, std::string("qwen3moe.expert_gating_func")},
                                std::pair{shared, std::string("blk.0.ffn_gate_inp_shexp.weight")},
                                std::pair{dense, std::string("blk.0.ffn_gate.weight")}}) {
    gg::testing::TempFile f(touchstone::testing::tiny_model(o), "moe_refused");
    ts_model* model = nullptr;
    EXPECT_NE(api->load_model(f.path().c_str(), &model), TS_OK) << name;
    EXPECT_NE(std::string(api->last_error()).find(name), std::string::npos) << api->last_error();
    if (model) api->free_model(model);
  }
}

// Three sessions at positions 0, 5 and 2 advanced by one step_batch (a chunk with
// all positions, a decode step, a chunk) == each alone, bitwise, on the quantized
// path: fp32 activations, then int8 activations at every int8 level.
void check_batch_invariance(const std::string& path) {
  const ts_backend* api = touchstone::cpu_simd::backend_table();
  const std::vector<int32_t> prefix = {3, 1, 4, 1, 5};
  const std::vector<std::vector<int32_t>> step = {{9, 2, 6, 5}, {3}, {5, 8, 9, 7, 9, 3}};
  const size_t at[3] = {0, 5, 2};
  const bool all[3] = {true, false, true};
  ts_model* model = nullptr;
  ASSERT_EQ(api->load_model(path.c_str(), &model), TS_OK) << api->last_error();
  const size_t V = size_t(api->n_vocab(model));
  std::vector<ts_session*> s(6);
  for (size_t k = 0; k < 6; ++k) {
    s[k] = open(model, TS_WEIGHTS_QUANTIZED, 2);
    ASSERT_NE(s[k], nullptr);
    std::vector<float> scratch(V);
    if (at[k % 3] > 0) {
      ASSERT_EQ(api->prefill(s[k], prefix.data(), int32_t(at[k % 3]), 0, scratch.data()), TS_OK);
    }
  }
  std::vector<std::vector<float>> batched(3), alone(3);
  std::vector<ts_batch_entry> e(3);
  for (size_t k = 0; k < 3; ++k) {
    const auto& t = step[k];
    batched[k].resize((all[k] ? t.size() : 1) * V);
    alone[k].resize(batched[k].size());
    e[k] = {sizeof(ts_batch_entry), s[k], t.data(), int32_t(t.size()), int32_t(all[k]),
            batched[k].data()};
    ASSERT_EQ(api->prefill(s[k + 3], t.data(), int32_t(t.size()), int32_t(all[k]), alone[k].data()),
              TS_OK);
  }
  ASSERT_EQ(api->step_batch(e.data(), 3), TS_OK) << api->last_error();
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(batched[k], alone[k]) << "entry " << k;
  for (ts_session* x : s) api->free_session(x);
  api->free_model(model);
}

TEST(Moe, StepBatchEqualsEachSessionAloneOnTheQuantizedPath) {
  using namespace touchstone::cpu_simd;
  select_isa_from_env();
  std::vector<Model> models = file_cases();
  // The int8 mode's row-interleaved copy (AVX-512 VNNI) holds every expert of a
  // type its kernel reads (their rows, 256 and 64, are multiples of 16).
  size_t n_r16 = 0;
  for (const Model& m : models) {
    SimdModel sm(m.path);
    for (const LayerView& L : sm.quantized_r16().layers) {
      for (const std::vector<Linear>* v : {&L.gate_exps, &L.up_exps, &L.down_exps}) {
        for (const Linear& w : *v) {
          if (!w.q || !r16_type(w.generic ? w.gtype : int(w.qtype))) continue;
          EXPECT_NE(w.r16, nullptr) << m.name;
          ++n_r16;
        }
      }
    }
  }
  if (!models.empty()) {
    EXPECT_GT(n_r16, 0u);
  }
  std::vector<std::unique_ptr<gg::testing::TempFile>> tiny;
  for (const auto& [name, o] : tiny_cases()) {
    tiny.push_back(std::make_unique<gg::testing::TempFile>(touchstone::testing::tiny_model(o),
                                                           "moe_batch_" + name));
    models.push_back({name, tiny.back()->path()});
  }
  for (int level = -1; level <= int(qlevel_best()); ++level) {
    SCOPED_TRACE(level < 0 ? "fp32 activations" : qlevel_name(QLevel(level)));
    if (level >= 0) {
      setenv("TOUCHSTONE_CPU_SIMD_ACTIVATIONS", "int8", 1);
      force_qlevel(QLevel(level));
    }
    for (const Model& m : models) {
      SCOPED_TRACE(m.name);
      check_batch_invariance(m.path);
    }
  }
  unsetenv("TOUCHSTONE_CPU_SIMD_ACTIVATIONS");
  force_qlevel(qlevel_best());
}

}  // namespace
