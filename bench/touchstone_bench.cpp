// touchstone_bench - performance of any backend behind the session contract.
//
//   touchstone_bench --backend cpu_simd [--backend vulkan,...] [--weights quantized,full_precision]
//                    [--model PATH] [--threads N] [--noisy-neighbour] [--decode-batch-looped]
//                    [google benchmark flags, e.g.
//                    --benchmark_out=r.json --benchmark_out_format=json --benchmark_filter=decode]
//
// Benchmarks, registered per backend x weight path (names <backend>/<weights>/...):
//   prefill/N        N = 64, 256, 512 prompt tokens from an empty cache (rewind(0)
//                    between iterations), last-position logits. Counter tok/s.
//                    prefill and decode make one untimed warm-up call first (graph
//                    backends compile lazily). Counter first_call_ms: open_session
//                    + (decode: the context's prefill +) the warm-up call, wall
//                    time; with a cold static_graph object cache
//                    (TOUCHSTONE_STATIC_GRAPH_CACHE= disables it) that is the
//                    compile time of the graph for this shape plus one run
//                    (TOUCHSTONE_STATIC_GRAPH_VERBOSE=1 prints the split).
//   decode/ctx:C     64 decode steps starting at context C = 0, 256, 1024 (then
//                    rewind(C)); the same work as llama-bench's tg64 for C = 0.
//                    Counters tok/s, bytes/token (weights streamed per token as
//                    stored: GGUF bytes for `quantized`, fp32 for `full_precision`,
//                    plus the fp32 KV cache read), GB/s (= tok/s * bytes/token).
//   ttft/N           open_session + prefill(N) until the first token's logits (ms).
//   decode_batch/B   B = 1, 4, 8, 16 sessions (prompts of different lengths,
//                    16 + 8 * (i % 8) tokens, different contents), then 16
//                    steps in which every session decodes one token, all B in
//                    one step_batch call (ABI v6). Counters tok/s (aggregate:
//                    B tokens per step), ms/step (each sequence's latency per
//                    token), batch. Registered only for backends whose
//                    step_batch is one forward pass (TS_CAP_BATCHED_SESSIONS,
//                    BatchMode::kNative); for the others it says why, on stderr
//                    and in the JSON context (decode_batch.<backend>), unless
//                    --decode-batch-looped registers it anyway (then it times B
//                    separate decodes per step: a baseline, not batching).
//   every benchmark: peak_rss_MB = the process's peak RSS since this
//                    (backend, weights) group loaded its model (VmHWM reset
//                    through /proc/self/clear_refs; one model loaded at a time).
//   decode_threads/threads:T/noisy:0|1   (only with --noisy-neighbour)
//                    decode/ctx:0 at T = 1 and 2 threads, without and with a
//                    bounded background load on one core (bench/noisy_neighbour.h);
//                    bench/noisy-neighbour prints the 2-thread / 1-thread ratio.
//   membw            read bandwidth of this machine with --threads threads (bytes_per_second),
//                    for the decode memory-bandwidth bound.
// Results print side by side; --benchmark_out gives JSON.
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "noisy_neighbour.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/model_config.h"
#include "touchstone/model/quant.h"
#include "touchstone/runtime/backend.h"

namespace {

struct Options {
  std::vector<std::string> backends;
  std::vector<std::string> weights{"quantized", "full_precision"};
  std::string model;
  int threads = 0;
  bool noisy_neighbour = false;
  bool decode_batch_looped = false;  // decode_batch also without TS_CAP_BATCHED_SESSIONS
} g_opt;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// ---- one loaded (backend, weights) group at a time ----
struct Group {
  std::string backend, weights;
  std::shared_ptr<touchstone::BackendLibrary> lib;
  std::unique_ptr<touchstone::BackendModel> model;
};
Group g_cur;

void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";  // resets VmHWM to the current RSS
}

double peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return 0.0;
}

ts_weight_path parse_weights(const std::string& w) {
  return w == "quantized" ? TS_WEIGHTS_QUANTIZED : TS_WEIGHTS_FULL_PRECISION;
}

touchstone::BackendModel& use(const std::string& backend, const std::string& weights) {
  if (g_cur.backend != backend || g_cur.weights != weights) {
    g_cur.model.reset();
    g_cur.lib.reset();
    reset_peak_rss();
    g_cur.backend = backend;
    g_cur.weights = weights;
    g_cur.lib = touchstone::BackendLibrary::load(backend);
    g_cur.model = std::make_unique<touchstone::BackendModel>(g_cur.lib, g_opt.model);
  }
  return *g_cur.model;
}

touchstone::BackendSessionOptions session_options(const std::string& weights, int32_t max_ctx) {
  touchstone::BackendSessionOptions o;
  o.weight_path = parse_weights(weights);
  o.n_threads = g_opt.threads;
  o.max_context = max_ctx;
  return o;
}

// A deterministic prompt; another salt gives other tokens.
std::vector<int32_t> prompt(size_t n, int32_t n_vocab, size_t salt = 0) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = int32_t((i * 7919 + 17 + salt * 131) % size_t(n_vocab));
  return t;
}

// Weight bytes streamed per decoded token (the LM head included; the
// embedding table only when it is also the LM head), from the GGUF itself.
struct ModelBytes {
  double quantized = 0, fp32 = 0, kv_per_token = 0;  // kv: fp32 K+V bytes per cached position
  std::map<std::string, double> by_type;             // quantized bytes per GGUF tensor type
};
ModelBytes model_bytes(const std::string& path) {
  const auto f = touchstone::gguf::File::open(path);
  // read_model_config, not read_llama_config: every family the reference reads
  // (Gemma 3, Qwen, ...) can be benchmarked; a backend that does not compute the
  // family refuses it at load (TS_ERR_UNSUPPORTED), reported per benchmark.
  const auto c = touchstone::read_model_config(f);
  ModelBytes b;
  for (const auto& t : f.tensors()) {
    if (t.name == "token_embd.weight" && !c.tied_embeddings) continue;
    b.quantized += double(t.n_bytes);
    b.fp32 += double(t.n_elements) * 4.0;
    b.by_type[std::string(touchstone::gguf::type_name(t.type))] += double(t.n_bytes);
  }
  b.kv_per_token = 2.0 * c.n_layer * c.n_head_kv * c.head_dim * 4.0;
  return b;
}
ModelBytes g_bytes;

void finish(benchmark::State& state, double tokens) {
  state.counters["tok/s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["peak_rss_MB"] = peak_rss_mb();
}

// first_call_ms: wall time from before open_session to the end of the
// untimed warm-up call (a graph backend may compile in either). Google
// Benchmark calls a benchmark function several times (to size the iteration
// count); only the first call of each benchmark can pay a lazy compile, so
// that one is kept and reported.
std::map<std::string, double> g_first_call_ms;
struct FirstCall {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  void done(benchmark::State& state, const std::string& key) const {
    const std::chrono::duration<double, std::milli> dt = std::chrono::steady_clock::now() - t0;
    state.counters["first_call_ms"] = g_first_call_ms.emplace(key, dt.count()).first->second;
  }
};

void bm_prefill(benchmark::State& state, std::string backend, std::string weights, int n) {
  try {
    auto& model = use(backend, weights);
    const auto tok = prompt(size_t(n), model.n_vocab());
    const FirstCall first;
    touchstone::BackendSession s(model, session_options(weights, n + 8));
    s.prefill(tok);  // warm-up, not timed: lazy graph compilation (static_graph)
    first.done(state, backend + "/" + weights + "/prefill/" + std::to_string(n));
    for (auto _ : state) {
      s.rewind(0);
      auto logits = s.prefill(tok);
      benchmark::DoNotOptimize(logits.data());
    }
    finish(state, double(state.iterations()) * n);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void bm_decode(benchmark::State& state, std::string backend, std::string weights, int ctx) {
  constexpr int kSteps = 64;
  try {
    auto& model = use(backend, weights);
    std::vector<float> logits(size_t(model.n_vocab()));
    const FirstCall first;  // for ctx > 0 this includes the prefill of the context
    touchstone::BackendSession s(model, session_options(weights, ctx + kSteps + 8));
    if (ctx > 0) s.prefill(prompt(size_t(ctx), model.n_vocab()));
    s.decode(1, logits);  // warm-up, not timed: lazy graph compilation (static_graph)
    first.done(state, backend + "/" + weights + "/decode/" + std::to_string(ctx));
    for (auto _ : state) {
      s.rewind(ctx);
      int32_t t = 1;
      for (int i = 0; i < kSteps; ++i) {
        s.decode(t, logits);
        t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // greedy
      }
      benchmark::DoNotOptimize(logits.data());
    }
    finish(state, double(state.iterations()) * kSteps);
    const double w = weights == "quantized" ? g_bytes.quantized : g_bytes.fp32;
    const double bytes = w + g_bytes.kv_per_token * (ctx + kSteps / 2.0);
    state.counters["bytes/token"] = bytes;
    state.counters["GB/s"] = benchmark::Counter(double(state.iterations()) * kSteps * bytes / 1e9,
                                                benchmark::Counter::kIsRate);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// decode/ctx:0 with an explicit thread count, optionally beside a noisy neighbour.
void bm_decode_threads(benchmark::State& state, std::string backend, std::string weights,
                       int threads, bool noisy, bool solo_fallback) {
  constexpr int kSteps = 64;
  try {
    auto& model = use(backend, weights);
    std::vector<float> logits(size_t(model.n_vocab()));
    touchstone::BackendSessionOptions o = session_options(weights, kSteps + 8);
    o.n_threads = threads;
    // Read by cpu_simd when the session is created; other backends ignore it.
    if (!solo_fallback) setenv("TOUCHSTONE_CPU_SIMD_SOLO_FALLBACK", "0", 1);
    touchstone::BackendSession s(model, o);
    unsetenv("TOUCHSTONE_CPU_SIMD_SOLO_FALLBACK");
    s.decode(1, logits);  // warm-up, not timed
    std::unique_ptr<touchstone::bench::NoisyNeighbour> neighbour;
    if (noisy) neighbour = std::make_unique<touchstone::bench::NoisyNeighbour>();
    for (auto _ : state) {
      s.rewind(0);
      int32_t t = 1;
      for (int i = 0; i < kSteps; ++i) {
        s.decode(t, logits);
        t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      benchmark::DoNotOptimize(logits.data());
    }
    finish(state, double(state.iterations()) * kSteps);
    state.counters["threads"] = threads;
    if (neighbour) state.counters["neighbour_cpu"] = neighbour->cpu();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// decode_batch/B: B sessions advanced together, one decode token each per
// step_batch call (greedy, each session its own sequence).
void bm_decode_batch(benchmark::State& state, std::string backend, std::string weights, int batch) {
  constexpr int kSteps = 16;
  try {
    auto& model = use(backend, weights);
    const auto n = size_t(batch);
    const FirstCall first;  // the B prefills + the warm-up step
    std::vector<std::unique_ptr<touchstone::BackendSession>> sessions;
    std::vector<int32_t> start, next(n, 1);
    std::vector<std::vector<float>> logits(n, std::vector<float>(size_t(model.n_vocab())));
    for (size_t i = 0; i < n; ++i) {
      const size_t len = 16 + 8 * (i % 8);  // different lengths and contents
      sessions.push_back(std::make_unique<touchstone::BackendSession>(
          model, session_options(weights, int32_t(len) + kSteps + 8)));
      sessions.back()->prefill(prompt(len, model.n_vocab(), i));
      start.push_back(sessions.back()->position());
    }
    std::vector<touchstone::BackendSession::Step> steps(n);
    auto step = [&] {
      for (size_t i = 0; i < n; ++i)
        steps[i] = {sessions[i].get(), std::span<const int32_t>(&next[i], 1), false, logits[i]};
      touchstone::BackendSession::step_batch(steps);
      for (size_t i = 0; i < n; ++i)  // greedy
        next[i] = int32_t(std::max_element(logits[i].begin(), logits[i].end()) - logits[i].begin());
    };
    step();  // warm-up, not timed: lazy graph compilation
    first.done(state, backend + "/" + weights + "/decode_batch/" + std::to_string(batch));
    std::chrono::duration<double, std::milli> stepping{0};
    for (auto _ : state) {
      for (size_t i = 0; i < n; ++i) {
        sessions[i]->rewind(start[i]);
        next[i] = 1;
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < kSteps; ++k) step();
      stepping += std::chrono::steady_clock::now() - t0;
      benchmark::DoNotOptimize(logits.data());
    }
    const double n_steps = double(state.iterations()) * kSteps;
    finish(state, n_steps * batch);
    state.counters["ms/step"] = stepping.count() / n_steps;  // each sequence's ms per token
    state.counters["batch"] = batch;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void bm_ttft(benchmark::State& state, std::string backend, std::string weights, int n) {
  try {
    auto& model = use(backend, weights);
    {
      touchstone::BackendSession warm(model, session_options(weights, n + 8));
    }  // lazy load not timed
    const auto tok = prompt(size_t(n), model.n_vocab());
    for (auto _ : state) {
      touchstone::BackendSession s(model, session_options(weights, n + 8));
      auto logits = s.prefill(tok);
      benchmark::DoNotOptimize(logits.data());
    }
    finish(state, double(state.iterations()) * n);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// Read bandwidth: each thread sums its slice of a 512 MiB buffer (>> L3).
uint64_t sum_slice(const uint64_t* p, size_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    a0 += p[i];
    a1 += p[i + 1];
    a2 += p[i + 2];
    a3 += p[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

void bm_membw(benchmark::State& state) {
  const int threads = g_opt.threads > 0 ? g_opt.threads : int(std::thread::hardware_concurrency());
  const size_t n = (size_t(512) << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n, 1);
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  for (auto _ : state) {
    std::vector<std::thread> th;
    const size_t per = n / size_t(threads);
    for (int i = 0; i < threads; ++i) {
      th.emplace_back([&, i] { sums[size_t(i)] = sum_slice(buf.data() + size_t(i) * per, per); });
    }
    for (auto& t : th) t.join();
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n * sizeof(uint64_t)));
  state.counters["threads"] = threads;
}

// Why decode_batch is not registered for this backend ("" = it is): it
// measures one forward pass for B sequences, which only a backend with
// TS_CAP_BATCHED_SESSIONS computes (a looped step_batch is B decodes).
std::string decode_batch_skip(const touchstone::BackendLibrary& lib) {
  try {
    const touchstone::BatchMode mode = lib.batch_mode();
    if (mode == touchstone::BatchMode::kNative) return "";
    return std::string("skipped: step_batch is ") + touchstone::batch_mode_name(mode) +
           ", not one forward pass (no TS_CAP_BATCHED_SESSIONS)";
  } catch (const std::exception& e) {
    return std::string("skipped: capabilities() failed: ") + e.what();
  }
}

// Every benchmark of one backend, per weight path.
void register_backend(const std::string& b, bool batched) {
  for (const auto& w : g_opt.weights) {
    const std::string p = b + "/" + w + "/";
    for (int n : {64, 256, 512}) {
      benchmark::RegisterBenchmark((p + "prefill/" + std::to_string(n)).c_str(), bm_prefill, b, w,
                                   n)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (int c : {0, 256, 1024}) {
      benchmark::RegisterBenchmark((p + "decode/ctx:" + std::to_string(c)).c_str(), bm_decode, b, w,
                                   c)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (int n : {64, 256}) {
      benchmark::RegisterBenchmark((p + "ttft/" + std::to_string(n)).c_str(), bm_ttft, b, w, n)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (int batch : {1, 4, 8, 16}) {
      if (!batched) break;
      benchmark::RegisterBenchmark((p + "decode_batch/" + std::to_string(batch)).c_str(),
                                   bm_decode_batch, b, w, batch)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (int noisy = 0; g_opt.noisy_neighbour && noisy <= 1; ++noisy) {
      // threads:2/solo_fallback:0: the same, with cpu_simd's solo fallback off
      // (TOUCHSTONE_CPU_SIMD_SOLO_FALLBACK=0), for the before/after in one run.
      for (const auto& [t, fallback] : {std::pair{1, true}, {2, true}, {2, false}}) {
        const std::string name = p + "decode_threads/threads:" + std::to_string(t) +
                                 (fallback ? "" : "/solo_fallback:0") +
                                 "/noisy:" + std::to_string(noisy);
        benchmark::RegisterBenchmark(name.c_str(), bm_decode_threads, b, w, t, noisy == 1, fallback)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* home = std::getenv("HOME");
  const char* mdir = std::getenv("TOUCHSTONE_MODEL_DIR");
  g_opt.model =
      std::string(mdir ? mdir : std::string(home ? home : "/root") + "/.cache/touchstone/models") +
      "/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const std::string f = flag;
      if (a == f && i + 1 < argc) return argv[++i];
      if (a.rfind(f + "=", 0) == 0) return argv[i] + f.size() + 1;
      return nullptr;
    };
    if (const char* v = value("--backend")) {
      for (auto& b : split(v)) g_opt.backends.push_back(b);
    } else if (const char* v2 = value("--weights")) {
      g_opt.weights = split(v2);
    } else if (const char* v3 = value("--model")) {
      g_opt.model = v3;
    } else if (const char* v4 = value("--threads")) {
      g_opt.threads = std::atoi(v4);
    } else if (a == "--noisy-neighbour") {
      g_opt.noisy_neighbour = true;
    } else if (a == "--decode-batch-looped") {
      g_opt.decode_batch_looped = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (g_opt.backends.empty()) g_opt.backends.push_back("cpu_simd");
  try {
    g_bytes = model_bytes(g_opt.model);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "touchstone_bench: %s\n", e.what());
    return 1;
  }
  benchmark::AddCustomContext("model", g_opt.model);
  benchmark::AddCustomContext("threads", std::to_string(g_opt.threads));
  // Decode's bytes per token by tensor type: "Q8_0=177.9,Q5_0=43.6,..." (MB).
  std::string by_type;
  for (const auto& [type, bytes] : g_bytes.by_type)
    by_type += fmt::format("{}{}={:.1f}", by_type.empty() ? "" : ",", type, bytes / 1e6);
  benchmark::AddCustomContext("bytes_per_token_by_type_MB", by_type);
  for (const auto& b : g_opt.backends) {
    std::string skip;
    try {
      auto lib = touchstone::BackendLibrary::load(b);
      benchmark::AddCustomContext("device." + b, lib->device_name());
      skip = decode_batch_skip(*lib);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "touchstone_bench: %s\n", e.what());
      return 1;
    }
    if (!skip.empty() && g_opt.decode_batch_looped) {
      skip = "";
      benchmark::AddCustomContext("decode_batch." + b, "looped: B separate decodes per step");
    } else if (!skip.empty()) {
      std::fprintf(stderr, "touchstone_bench: %s/decode_batch %s\n", b.c_str(), skip.c_str());
      benchmark::AddCustomContext("decode_batch." + b, skip);
    }
    register_backend(b, skip.empty());
  }
  benchmark::RegisterBenchmark("membw/read", bm_membw)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  int rc = int(rest.size());
  benchmark::Initialize(&rc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rc, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_cur.model.reset();
  return 0;
}
