// cuda_run.cpp - one session's calls: prefill in chunks of up to kMaxBatch
// tokens, decode as a CUDA graph (captured once per session: the kernels read
// the position and the token from s.params), and prefill_greedy with the
// argmax on the device. The forward pass itself is cuda_forward.cpp.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda_session.h"
#include "touchstone/abi/backend_impl.h"

namespace touchstone::cuda {
namespace {

using touchstone::abi::StatusError;

// params = [position, KV floor, tokens...] (kernels.h).
void stage_params(CudaSession& s, const int32_t* tokens, int n) {
  auto* hp = static_cast<int32_t*>(s.h_params.get());
  hp[0] = s.pos;
  hp[1] = s.faults.rewind_noop ? s.kv_len : 0;
  std::memcpy(hp + 2, tokens, size_t(n) * sizeof(int32_t));
  TS_CUDA(cudaMemcpyAsync(s.params.get(), hp, size_t(n + 2) * sizeof(int32_t),
                          cudaMemcpyHostToDevice, s.stream));
}

void verify_argmax(CudaSession& s, const float* logits) {
  if (!s.check_argmax || s.faults.logit_noise != 0.0) return;  // the device saw unperturbed logits
  const int V = s.model->cfg.n_vocab;
  cm::ArgMax best{0.0f, -1};
  for (int i = 0; i < V; ++i) best = cm::argmax_merge(best, cm::argmax_leaf(logits[i], i));
  const int32_t dev = *static_cast<const int32_t*>(s.h_argmax.get());
  if (dev != best.id) {
    throw StatusError(
        TS_ERR_INTERNAL,
        fmt::format("device argmax {} != host argmax {} of the same logits", dev, best.id));
  }
}

// Captures the decode step (forward + tail) as the session's CUDA graph.
template <typename Tail>
void capture_decode(CudaSession& s, Tail&& enqueue_tail) {
  TS_CUDA(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t g = nullptr;
  try {
    enqueue_forward(s, 1, Logits::Last);
    enqueue_tail();
  } catch (...) {
    cudaStreamEndCapture(s.stream, &g);
    if (g) cudaGraphDestroy(g);
    throw;
  }
  TS_CUDA(cudaStreamEndCapture(s.stream, &g));
  const cudaError_t e = cudaGraphInstantiate(&s.graph, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    s.graph = nullptr;
    cuda_fail(e, "cudaGraphInstantiate(decode step)");
  }
}

}  // namespace

void advance(CudaSession& s, int n) {
  s.pos += n;
  s.kv_len = std::max(s.kv_len, s.pos);
}

// The logits_perturb_1e-3 fault: logit i of position p times
// 1 + noise * fault_noise_sign(p * n_vocab + i) (touchstone/model/faults.h), fp64, on the host.
void perturb_logits(const CudaSession& s, float* rows, int n_rows, int first_pos) {
  if (s.faults.logit_noise == 0.0) return;
  const size_t V = size_t(s.model->cfg.n_vocab);
  for (int r = 0; r < n_rows; ++r) {
    const uint64_t base = uint64_t(first_pos + r) * uint64_t(V);
    float* row = rows + size_t(r) * V;
    for (size_t i = 0; i < V; ++i) {
      row[i] = static_cast<float>(
          double{row[i]} * (1.0 + s.faults.logit_noise * touchstone::fault_noise_sign(base + i)));
    }
  }
}

// The faults logits_row_shift (any all-position call) and verify_row_shift
// (one that continues a sequence) return row i-1 as row i.
void shift_rows(const CudaSession& s, int start, int n, bool all_positions, float* logits) {
  const bool shift = s.faults.logits_row_shift || (s.faults.verify_row_shift && start > 0);
  if (!shift || !all_positions || n <= 1) return;
  const size_t V = size_t(s.model->cfg.n_vocab);
  std::memmove(logits + V, logits, size_t(n - 1) * V * sizeof(float));
}

// Decode one token: graph launch (captured on first use) or plain launches
// (TOUCHSTONE_CUDA_GRAPH=0, layer taps on, or a split-K fault: cuBLAS in decode).
void run_decode(CudaSession& s, int32_t token, float* logits_out) {
  const int V = s.model->cfg.n_vocab;
  auto enqueue_tail = [&] {
    check_launch(launch_argmax(as<float>(s.logits), V, as<int32_t>(s.argmax), s.stream), "argmax");
    TS_CUDA(cudaMemcpyAsync(s.h_logits.get(), s.logits.get(), size_t(V) * sizeof(float),
                            cudaMemcpyDeviceToHost, s.stream));
    TS_CUDA(cudaMemcpyAsync(s.h_argmax.get(), s.argmax.get(), sizeof(int32_t),
                            cudaMemcpyDeviceToHost, s.stream));
  };
  stage_params(s, &token, 1);
  if (s.use_graph && !s.taps_on && s.split <= 1) {
    if (!s.graph) capture_decode(s, enqueue_tail);
    TS_CUDA(cudaGraphLaunch(s.graph, s.stream));
  } else {
    enqueue_forward(s, 1, Logits::Last);
    enqueue_tail();
  }
  TS_CUDA(cudaStreamSynchronize(s.stream));
  std::memcpy(logits_out, s.h_logits.get(), size_t(V) * sizeof(float));
  verify_argmax(s, logits_out);
  perturb_logits(s, logits_out, 1, s.pos);
  advance(s, 1);
}

void run_prefill(CudaSession& s, const int32_t* tokens, int n, bool all_positions,
                 float* logits_out) {
  const size_t V = size_t(s.model->cfg.n_vocab);
  const int start = s.pos;
  // prefill_position_reset fault: a prefill continuing a sequence rotates its
  // tokens as positions 0, 1, ... (K/V still stored at their own rows).
  const int rope_origin = s.faults.prefill_position_reset && n > 1 ? start : 0;
  for (int off = 0; off < n; off += kMaxBatch) {
    const int cnt = std::min(kMaxBatch, n - off);
    const bool last = off + cnt == n;
    stage_params(s, tokens + off, cnt);
    const Logits mode = all_positions ? Logits::All : (last ? Logits::Last : Logits::None);
    enqueue_forward(s, cnt, mode, rope_origin);
    if (mode == Logits::All) {
      TS_CUDA(cudaMemcpyAsync(logits_out + size_t(off) * V, s.logits.get(),
                              size_t(cnt) * V * sizeof(float), cudaMemcpyDeviceToHost, s.stream));
    } else if (mode == Logits::Last) {
      TS_CUDA(cudaMemcpyAsync(s.h_logits.get(), s.logits.get(), V * sizeof(float),
                              cudaMemcpyDeviceToHost, s.stream));
    }
    TS_CUDA(cudaStreamSynchronize(s.stream));
    if (mode == Logits::Last) std::memcpy(logits_out, s.h_logits.get(), V * sizeof(float));
    advance(s, cnt);
  }
  perturb_logits(s, logits_out, all_positions ? n : 1, all_positions ? start : start + n - 1);
  shift_rows(s, start, n, all_positions, logits_out);
}

// prefill_greedy: the forward pass as run_prefill (last position's logits stay
// on the device), the argmax kernel (lowest id on ties, NaN never wins), and a
// 4-byte copy back. Not captured as a graph. Under the logits_perturb fault the
// logits come back and the host takes the argmax of the perturbed logits.
int32_t run_greedy(CudaSession& s, const int32_t* tokens, int n) {
  const int V = s.model->cfg.n_vocab;
  if (s.faults.logit_noise != 0.0) {
    std::vector<float> logits(static_cast<size_t>(V));
    run_prefill(s, tokens, n, false, logits.data());
    return touchstone::abi::greedy_argmax(logits.data(), V);
  }
  for (int off = 0; off < n; off += kMaxBatch) {
    const int cnt = std::min(kMaxBatch, n - off);
    const bool last = off + cnt == n;
    stage_params(s, tokens + off, cnt);
    enqueue_forward(s, cnt, last ? Logits::Last : Logits::None,
                    s.faults.prefill_position_reset && n > 1 ? s.pos - off : 0);
    if (last) {
      check_launch(launch_argmax(as<float>(s.logits), V, as<int32_t>(s.argmax), s.stream),
                   "argmax");
      TS_CUDA(cudaMemcpyAsync(s.h_argmax.get(), s.argmax.get(), sizeof(int32_t),
                              cudaMemcpyDeviceToHost, s.stream));
    }
    TS_CUDA(cudaStreamSynchronize(s.stream));
    advance(s, cnt);
  }
  const int32_t tok = *static_cast<const int32_t*>(s.h_argmax.get());
  if (tok < 0 || tok >= V) {
    throw StatusError(TS_ERR_INTERNAL,
                      fmt::format("device argmax returned {} (all logits NaN?)", tok));
  }
  return tok;
}

}  // namespace touchstone::cuda
