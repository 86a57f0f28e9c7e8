// cpu_simd_kernels_bench - the cpu_simd backend's quantized kernels in isolation
// (Google Benchmark, one thread). Not a test; use it to compare kernel changes.
//
//   touchstone_cpu_simd_kernels_bench [--benchmark_filter=...]
//
// Benchmarks (name: what):
//   q4_1/decode/l2      1536 x 576 Q4_1 rows (553 KB, stays in L2) x 1 token: compute bound
//   q4_1/decode/dram    a 72 MB Q4_1 matrix (rows cycled, never cache resident) x 1 token
//   q8_0/decode/dram    49152 x 576 Q8_0 (SmolLM2's LM head, 30 MB) x 1 token
//   q8_0/decode/l2      1024 x 576 Q8_0 rows (627 KB, in L2) x 1 token
//   q4_1/prefill/64     4096 x 576 Q4_1 rows x 64 tokens
//   q4_0/..., q8_0/prefill/64   the same shapes for Q4_0 / Q8_0
//   q4_k/..., q6_k/...  K-quant rows of 1024 inputs (Gemma 3's attn_output / ffn_down
//                       types) through gemm_blocks_f32; int8/q4_k/... through gemm_q_r16
//   q5_0/...            the same for Q5_0 (Gemma 3's attn_q/k, ffn_gate/up)
//   */batch/8           8 tokens (a batched decode step of 8 sequences: ABI v6
//                       step_batch): q4_1 / q4_0 / q8_0 over 16384 x 576 rows (6-10 MB,
//                       beyond L2), the K-quants and Q5_0 over 4096 x 1024
// Counters: GMAC/s (multiply-adds per second), GB/s (weight bytes per second).
// Activations are fp32 (the default quantized path: gemm_q_f32); int8/... the same
// shapes with int8 activations (TOUCHSTONE_CPU_SIMD_ACTIVATIONS=int8): gemm_q_r16 on
// the row-interleaved records where the int8 level is AVX-512 VNNI, else gemm_q.
// TOUCHSTONE_CPU_SIMD_TARGET=<Highway target> forces a target (and caps the int8
// level) as in the backend; the first line printed names what ran.
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels.h"

namespace {

using touchstone::cpu_simd::QType;

constexpr size_t kIn = 576;

std::vector<uint8_t> random_blocks(QType t, size_t rows, uint32_t seed) {
  const size_t bb = touchstone::cpu_simd::qtype_block_bytes(t), nb = kIn / 32;
  std::vector<uint8_t> w(rows * nb * bb);
  std::mt19937 rng(seed);
  for (auto& b : w) b = uint8_t(rng());
  // Valid small fp16 scales (0x2000..0x23ff ~ 0.0078..0.0098) for d (and m).
  for (size_t i = 0; i < rows * nb; ++i) {
    uint8_t* blk = w.data() + i * bb;
    blk[0] = uint8_t(rng());
    blk[1] = 0x20;
    if (t == QType::Q4_1) {
      blk[2] = uint8_t(rng());
      blk[3] = 0xa0;  // negative min
    }
  }
  return w;
}

std::vector<float> random_act(size_t n_tok) {
  std::vector<float> x(n_tok * kIn);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  return x;
}

void run(benchmark::State& state, QType t, size_t rows, size_t slice, size_t n_tok) {
  const auto w0 = random_blocks(t, rows, 1);
  const size_t bytes = (w0.size() + (2u << 20) - 1) & ~size_t((2u << 20) - 1);
  uint8_t* wp = static_cast<uint8_t*>(std::aligned_alloc(2u << 20, bytes));
  if (getenv("HUGE")) madvise(wp, bytes, MADV_HUGEPAGE);
  std::memcpy(wp, w0.data(), w0.size());
  struct {
    uint8_t* p;
    const uint8_t* data() const { return p; }
  } w{wp};
  const auto x = random_act(n_tok);
  const size_t row_bytes = touchstone::cpu_simd::qtype_block_bytes(t) * (kIn / 32);
  std::vector<float> y(n_tok * slice);
  size_t r0 = 0;
  for (auto _ : state) {
    touchstone::cpu_simd::gemm_q_f32(t, w.data() + r0 * row_bytes, row_bytes, kIn / 32, 0, slice,
                                     x.data(), kIn, n_tok, y.data(), slice);
    benchmark::DoNotOptimize(y.data());
    r0 = (r0 + slice) % rows;
  }
  const double macs = double(slice) * double(kIn) * double(n_tok) * double(state.iterations());
  state.counters["GMAC/s"] = benchmark::Counter(macs * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(
      double(slice * row_bytes) * double(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

// The same with llama.cpp-style int8 activations (gemm_q, VNNI where present).
void run_int8(benchmark::State& state, QType t, size_t rows, size_t slice, size_t n_tok) {
  const auto w0 = random_blocks(t, rows, 1);
  const auto x = random_act(n_tok);
  const size_t nb = kIn / 32, row_bytes = touchstone::cpu_simd::qtype_block_bytes(t) * nb;
  std::vector<int8_t> qs(n_tok * kIn);
  std::vector<float> d(n_tok * nb), sm(n_tok * nb);
  std::vector<touchstone::cpu_simd::ActRow> X(n_tok);
  for (size_t k = 0; k < n_tok; ++k) {
    X[k] = touchstone::cpu_simd::ActRow{qs.data() + k * kIn, d.data() + k * nb, sm.data() + k * nb};
    touchstone::cpu_simd::quantize_act(x.data() + k * kIn, kIn, X[k]);
  }
  std::vector<float> y(n_tok * slice);
  // What the backend runs: the row-interleaved records on AVX-512 VNNI.
  const bool r16 = touchstone::cpu_simd::qlevel() == touchstone::cpu_simd::QLevel::AVX512VNNI;
  std::vector<uint8_t> R;
  if (r16) {
    R.resize(touchstone::cpu_simd::r16_bytes(int(t), rows, nb));
    touchstone::cpu_simd::repack_r16(int(t), w0.data(), row_bytes, nb, rows, R.data());
  }
  size_t r0 = 0;
  for (auto _ : state) {
    if (r16) {
      touchstone::cpu_simd::gemm_q_r16(int(t), R.data() + r0 * row_bytes, nb, 0, slice, X.data(),
                                       n_tok, y.data(), slice);
    } else {
      touchstone::cpu_simd::gemm_q(t, w0.data() + r0 * row_bytes, row_bytes, nb, 0, slice, X.data(),
                                   n_tok, y.data(), slice);
    }
    benchmark::DoNotOptimize(y.data());
    r0 = (r0 + slice) % rows;
  }
  const double macs = double(slice) * double(kIn) * double(n_tok) * double(state.iterations());
  state.counters["GMAC/s"] = benchmark::Counter(macs * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(
      double(slice * row_bytes) * double(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

// K-quant blocks (ggml type 12 = Q4_K, 144 bytes; 14 = Q6_K, 210 bytes; 256
// elements) and Q5_0 (type 6, 22 bytes, 32 elements) with valid fp16 scales,
// rows of kKIn inputs.
constexpr size_t kKIn = 1024;
void run_k(benchmark::State& state, int type, size_t rows, size_t n_tok, bool int8) {
  const size_t be = type == 6 ? 32 : 256;
  const size_t bb = type == 12 ? 144 : type == 14 ? 210 : 22, nb = kKIn / be, row_bytes = nb * bb;
  std::vector<uint8_t> w(rows * row_bytes);
  std::mt19937 rng(3);
  for (auto& b : w) b = uint8_t(rng());
  for (size_t i = 0; i < rows * nb; ++i) {
    uint8_t* blk = w.data() + i * bb;
    if (type == 12) {
      blk[1] = 0x20;  // d, dmin
      blk[3] = 0x20;
    } else if (type == 6) {
      blk[1] = 0x20;  // d
    } else {
      blk[209] = 0x20;
    }
  }
  std::vector<float> x(n_tok * kKIn);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  std::vector<float> y(n_tok * rows);
  // int8: the row-interleaved kernel (AVX-512 VNNI only; elsewhere the backend
  // keeps fp32 activations for these types).
  const size_t nb32 = kKIn / 32;
  std::vector<int8_t> qs(n_tok * kKIn);
  std::vector<float> d(n_tok * nb32), sm(n_tok * nb32);
  std::vector<touchstone::cpu_simd::ActRow> X(n_tok);
  std::vector<uint8_t> R;
  if (int8) {
    if (touchstone::cpu_simd::qlevel() != touchstone::cpu_simd::QLevel::AVX512VNNI) {
      state.SkipWithError("int8 K-quant / Q5_0 kernel needs AVX-512 VNNI");
      return;
    }
    for (size_t k = 0; k < n_tok; ++k) {
      X[k] = touchstone::cpu_simd::ActRow{qs.data() + k * kKIn, d.data() + k * nb32,
                                          sm.data() + k * nb32};
      touchstone::cpu_simd::quantize_act(x.data() + k * kKIn, kKIn, X[k]);
    }
    R.resize(touchstone::cpu_simd::r16_bytes(type, rows, nb32));
    touchstone::cpu_simd::repack_r16(type, w.data(), row_bytes, nb32, rows, R.data());
  }
  for (auto _ : state) {
    if (int8) {
      touchstone::cpu_simd::gemm_q_r16(type, R.data(), nb32, 0, rows, X.data(), n_tok, y.data(),
                                       rows);
    } else {
      touchstone::cpu_simd::gemm_blocks_f32(type, w.data(), row_bytes, be, bb, 0, rows, x.data(),
                                            kKIn, n_tok, y.data(), rows);
    }
    benchmark::DoNotOptimize(y.data());
  }
  const double macs = double(rows) * double(kKIn) * double(n_tok) * double(state.iterations());
  state.counters["GMAC/s"] = benchmark::Counter(macs * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(
      double(rows * row_bytes) * double(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

void BM_q4_1_decode_l2(benchmark::State& s) { run(s, QType::Q4_1, 1536, 1536, 1); }
void BM_q4_1_decode_dram(benchmark::State& s) { run(s, QType::Q4_1, 196608, 1536, 1); }
void BM_q8_0_decode_dram(benchmark::State& s) { run(s, QType::Q8_0, 49152, 49152, 1); }
void BM_q8_0_decode_l2(benchmark::State& s) { run(s, QType::Q8_0, 1024, 1024, 1); }
void BM_q4_1_prefill_64(benchmark::State& s) { run(s, QType::Q4_1, 4096, 4096, 64); }

}  // namespace

BENCHMARK(BM_q4_1_decode_l2)->Name("q4_1/decode/l2");
BENCHMARK_CAPTURE(run_int8, l2, QType::Q4_1, 1536, 1536, 1)->Name("int8/q4_1/decode/l2");
BENCHMARK_CAPTURE(run_int8, dram, QType::Q4_1, 196608, 1536, 1)->Name("int8/q4_1/decode/dram");
BENCHMARK_CAPTURE(run_int8, q8, QType::Q8_0, 49152, 49152, 1)->Name("int8/q8_0/decode/dram");
BENCHMARK_CAPTURE(run_int8, q8l2, QType::Q8_0, 1024, 1024, 1)->Name("int8/q8_0/decode/l2");
BENCHMARK_CAPTURE(run_int8, pf, QType::Q4_1, 4096, 4096, 64)->Name("int8/q4_1/prefill/64");
BENCHMARK(BM_q4_1_decode_dram)->Name("q4_1/decode/dram");
BENCHMARK(BM_q8_0_decode_dram)->Name("q8_0/decode/dram");
BENCHMARK(BM_q8_0_decode_l2)->Name("q8_0/decode/l2");
BENCHMARK(BM_q4_1_prefill_64)->Name("q4_1/prefill/64");
BENCHMARK_CAPTURE(run, q40l2, QType::Q4_0, 1536, 1536, 1)->Name("q4_0/decode/l2");
BENCHMARK_CAPTURE(run, q40pf, QType::Q4_0, 4096, 4096, 64)->Name("q4_0/prefill/64");
BENCHMARK_CAPTURE(run, q80pf, QType::Q8_0, 4096, 4096, 64)->Name("q8_0/prefill/64");
BENCHMARK_CAPTURE(run_int8, q40l2, QType::Q4_0, 1536, 1536, 1)->Name("int8/q4_0/decode/l2");
BENCHMARK_CAPTURE(run_int8, q40pf, QType::Q4_0, 4096, 4096, 64)->Name("int8/q4_0/prefill/64");
BENCHMARK_CAPTURE(run_int8, q80pf, QType::Q8_0, 4096, 4096, 64)->Name("int8/q8_0/prefill/64");
BENCHMARK_CAPTURE(run_k, q4kl2, 12, 512, 1, false)->Name("q4_k/decode/l2");
BENCHMARK_CAPTURE(run_k, q4kl2i8, 12, 512, 1, true)->Name("int8/q4_k/decode/l2");
BENCHMARK_CAPTURE(run_k, q4kpf, 12, 1024, 64, false)->Name("q4_k/prefill/64");
BENCHMARK_CAPTURE(run_k, q4kpfi8, 12, 1024, 64, true)->Name("int8/q4_k/prefill/64");
BENCHMARK_CAPTURE(run_k, q6kl2, 14, 512, 1, false)->Name("q6_k/decode/l2");
BENCHMARK_CAPTURE(run_k, q6kl2i8, 14, 512, 1, true)->Name("int8/q6_k/decode/l2");
BENCHMARK_CAPTURE(run_k, q6kpf, 14, 1024, 64, false)->Name("q6_k/prefill/64");
BENCHMARK_CAPTURE(run_k, q6kpfi8, 14, 1024, 64, true)->Name("int8/q6_k/prefill/64");
BENCHMARK_CAPTURE(run_k, q50l2, 6, 512, 1, false)->Name("q5_0/decode/l2");
BENCHMARK_CAPTURE(run_k, q50l2i8, 6, 512, 1, true)->Name("int8/q5_0/decode/l2");
BENCHMARK_CAPTURE(run_k, q50pf, 6, 1024, 64, false)->Name("q5_0/prefill/64");
BENCHMARK_CAPTURE(run_k, q50pfi8, 6, 1024, 64, true)->Name("int8/q5_0/prefill/64");
BENCHMARK_CAPTURE(run, q41b8, QType::Q4_1, 16384, 16384, 8)->Name("q4_1/batch/8");
BENCHMARK_CAPTURE(run, q40b8, QType::Q4_0, 16384, 16384, 8)->Name("q4_0/batch/8");
BENCHMARK_CAPTURE(run, q80b8, QType::Q8_0, 16384, 16384, 8)->Name("q8_0/batch/8");
BENCHMARK_CAPTURE(run_int8, q41b8, QType::Q4_1, 16384, 16384, 8)->Name("int8/q4_1/batch/8");
BENCHMARK_CAPTURE(run_k, q4kb8, 12, 4096, 8, false)->Name("q4_k/batch/8");
BENCHMARK_CAPTURE(run_k, q6kb8, 14, 4096, 8, false)->Name("q6_k/batch/8");
BENCHMARK_CAPTURE(run_k, q50b8, 6, 4096, 8, false)->Name("q5_0/batch/8");

int main(int argc, char** argv) {
  const touchstone::cpu_simd::IsaSelection& sel = touchstone::cpu_simd::select_isa_from_env();
  if (sel.status != touchstone::cpu_simd::IsaSelection::Ok) {
    std::fprintf(stderr, "%s\n", sel.message.c_str());
    return 1;
  }
  std::printf("kernels: Highway %s%s, int8 level %s\n",
              touchstone::cpu_simd::hwy_current_target().c_str(),
              sel.forced.empty() ? "" : " (forced by TOUCHSTONE_CPU_SIMD_TARGET)",
              touchstone::cpu_simd::qlevel_name(touchstone::cpu_simd::qlevel()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
