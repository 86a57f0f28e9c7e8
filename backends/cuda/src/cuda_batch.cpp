// cuda_batch.cpp - ABI v6 serving on the device.
//  * step_batch: the entries' tokens, concatenated, in passes of up to
//    kMaxBatch rows (cuda_forward.cpp's Pass: every matrix product over all
//    rows with the lead's = entry 0's buffers, RoPE + KV store and attention
//    per segment against its own KV cache), each pass's [position, KV floor]
//    records and token ids staged once; logits only for the rows that need
//    them, copied into each entry's buffer.
//  * fork_session: a new session with the source's options, KV rows copied
//    device to device.
// Everything runs on the lead's stream; the other sessions' caches, RoPE
// tables and tap buffers are device pointers it writes and reads.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "cuda_session.h"
#include "touchstone/abi/batch_plan.h"

namespace touchstone::cuda {
namespace {

// One pass: the plan (segs[k] is pass.pieces[k]), its segments and token ids.
struct Planned {
  const PlannedPass& pass;
  std::vector<Segment> segs;
  std::vector<int32_t> tokens;
};

// One pass computes with the lead's weights, faults and split-K slices:
// sessions that differ there run one by one.
bool one_pass(std::span<const BatchEntry> e) {
  const CudaSession& lead = *e[0].s;
  return std::all_of(e.begin(), e.end(), [&](const BatchEntry& x) {
    const CudaSession& s = *x.s;
    return s.model == lead.model && s.w == lead.w && s.split == lead.split &&
           s.faults.name == lead.faults.name;
  });
}

// Per entry, the RoPE origin of its tokens (table row = position - origin).
// prefill_position_reset: a prefill continuing a sequence rotates from 0 (as
// run_prefill); batch_position_offset: entry i > 0 rotates as if its tokens
// followed the earlier entries' tokens, when that stays inside its RoPE table.
std::vector<int> rope_origins(std::span<const BatchEntry> e) {
  const touchstone::Faults& f = e[0].s->faults;
  std::vector<int> origin;
  int64_t total = 0;  // tokens of the entries before
  for (const BatchEntry& x : e) {
    const CudaSession& s = *x.s;
    int o = f.prefill_position_reset && x.n > 1 ? s.pos : 0;
    if (f.batch_position_offset && total + s.pos + x.n <= s.max_ctx) o -= int(total);
    origin.push_back(o);
    total += x.n;
  }
  return origin;
}

// A planned pass (touchstone::plan_passes) as segments, with its token ids.
Planned segments_of(std::span<const BatchEntry> e, const std::vector<int>& origin,
                    const PlannedPass& p) {
  Planned pl{p, {}, {}};
  for (const PassPiece& k : p.pieces) {
    const BatchEntry& x = e[k.entry];
    Segment g;
    g.s = x.s;
    g.row0 = k.row0;
    g.n = k.n;
    g.rope_origin = origin[k.entry];
    g.out_rows = k.out_rows;
    g.out_row0 = k.out_row0;
    g.tap = x.s->taps_on && k.completes;  // the call's last row, as run_prefill leaves it
    pl.segs.push_back(g);
    pl.tokens.insert(pl.tokens.end(), x.tokens + k.offset, x.tokens + k.offset + k.n);
  }
  return pl;
}

// The pass's parameters into the lead's pinned staging, then one copy to its
// bparams: segment k's [position, KV floor] at 2k (the rewind_noop fault's
// floor is that session's high-water mark), the token ids at 2 * kMaxBatch.
// The staging is rewritten only after the previous pass's synchronize.
void stage_pass(CudaSession& lead, Planned& pl) {
  auto* hp = static_cast<int32_t*>(lead.h_bparams.get());
  int32_t* dp = as<int32_t>(lead.bparams);
  for (size_t k = 0; k < pl.segs.size(); ++k) {
    const CudaSession& s = *pl.segs[k].s;
    hp[2 * k] = s.pos;
    hp[2 * k + 1] = s.faults.rewind_noop ? s.kv_len : 0;
    pl.segs[k].d_params = dp + 2 * k;
  }
  std::memcpy(hp + 2 * kMaxBatch, pl.tokens.data(), pl.tokens.size() * sizeof(int32_t));
  TS_CUDA(cudaMemcpyAsync(dp, hp, (2 * size_t(kMaxBatch) + pl.tokens.size()) * sizeof(int32_t),
                          cudaMemcpyHostToDevice, lead.stream));
}

// Runs one planned pass on the lead's stream, copies each segment's logits rows
// into its entry's buffer, synchronizes, then applies logits_perturb per
// segment (at its rows' positions) and advances every segment's session.
void run_pass(std::span<const BatchEntry> e, Planned& pl) {
  CudaSession& lead = *e[0].s;
  const size_t V = size_t(lead.model->cfg.n_vocab);
  stage_pass(lead, pl);
  const Pass p{pl.segs, pl.pass.rows, pl.pass.out_rows, as<int32_t>(lead.bparams) + 2 * kMaxBatch};
  enqueue_pass(lead, p);
  std::vector<float*> dst(pl.segs.size(), nullptr);
  for (size_t k = 0; k < pl.segs.size(); ++k) {
    const Segment& g = pl.segs[k];
    if (g.out_rows == 0) continue;
    const PassPiece& piece = pl.pass.pieces[k];
    const BatchEntry& x = e[piece.entry];
    dst[k] = x.all_positions ? x.logits + size_t(piece.offset) * V : x.logits;
    TS_CUDA(cudaMemcpyAsync(dst[k], as<float>(lead.logits) + size_t(g.out_row0) * V,
                            size_t(g.out_rows) * V * sizeof(float), cudaMemcpyDeviceToHost,
                            lead.stream));
  }
  TS_CUDA(cudaStreamSynchronize(lead.stream));
  for (size_t k = 0; k < pl.segs.size(); ++k) {
    const Segment& g = pl.segs[k];
    CudaSession& s = *g.s;
    if (dst[k]) perturb_logits(s, dst[k], g.out_rows, s.pos + g.n - g.out_rows);
    advance(s, g.n);
  }
}

// Device rows [0, n_prefix) of src's KV cache into dst's (same max_ctx), every
// layer. kv_write_next stores position p at row p + 1 (row 0 stays zero): one
// row more. The fork_short_copy fault copies one row fewer and zeroes it.
void copy_kv_prefix(CudaSession& src, CudaSession& dst, int n_prefix) {
  const touchstone::ModelConfig& c = src.model->cfg;
  const size_t row = size_t(c.n_head_kv) * size_t(c.head_dim) * sizeof(float);
  const size_t layer = size_t(src.max_ctx) * row;
  const int rows = std::min(n_prefix + (src.faults.kv_write_next ? 1 : 0), src.max_ctx);
  const int copied = src.faults.fork_short_copy && n_prefix > 0 ? rows - 1 : rows;
  // src's stream is idle between calls; dst's still orders its caches' zeroing.
  TS_CUDA(cudaStreamSynchronize(src.stream));
  for (int l = 0; l < c.n_layer; ++l) {
    const size_t at = size_t(l) * layer;
    for (auto [from, to] : {std::pair{src.k_cache.get(), dst.k_cache.get()},
                            std::pair{src.v_cache.get(), dst.v_cache.get()}}) {
      auto* t = static_cast<uint8_t*>(to) + at;
      if (copied > 0) {
        TS_CUDA(cudaMemcpyAsync(t, static_cast<const uint8_t*>(from) + at, size_t(copied) * row,
                                cudaMemcpyDeviceToDevice, dst.stream));
      }
      if (copied < rows) TS_CUDA(cudaMemsetAsync(t + size_t(copied) * row, 0, row, dst.stream));
    }
  }
  TS_CUDA(cudaStreamSynchronize(dst.stream));
}

}  // namespace

void step_batch(std::span<const BatchEntry> e) {
  CudaSession& lead = *e[0].s;
  TS_CUDA(cudaSetDevice(lead.model->device));
  if (!one_pass(e)) {
    for (const BatchEntry& x : e) run_prefill(*x.s, x.tokens, x.n, x.all_positions, x.logits);
    return;
  }
  std::vector<int> start;
  for (const BatchEntry& x : e) {
    start.push_back(x.s->pos);
    // Each session's own stream is idle between calls; the passes run on the lead's.
    TS_CUDA(cudaStreamSynchronize(x.s->stream));
  }
  const std::vector<int> origin = rope_origins(e);
  try {
    for (const PlannedPass& p : plan_passes(e, kMaxBatch)) {
      Planned pl = segments_of(e, origin, p);
      run_pass(e, pl);
    }
  } catch (...) {
    // Work already enqueued writes other sessions' caches: let it finish
    // before any of them runs on its own stream (the adapter rewinds them).
    cudaStreamSynchronize(lead.stream);
    throw;
  }
  for (size_t k = 0; k < e.size(); ++k)
    shift_rows(*e[k].s, start[k], e[k].n, e[k].all_positions, e[k].logits);
}

std::unique_ptr<CudaSession> fork_session(CudaSession& src, int n_prefix) {
  auto f = new_session(*src.model, src.opts);
  copy_kv_prefix(src, *f, n_prefix);
  f->pos = f->kv_len = n_prefix;
  return f;
}

}  // namespace touchstone::cuda
