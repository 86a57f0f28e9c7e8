// engine_batch.cpp - the entry points that drive forward passes: one
// session's prefill() (prefill chunks, governed decode steps), step_batch
// (several sessions in passes of at most kMaxBatch tokens) and fork.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "engine.h"
#include "touchstone/abi/backend_adapter.hpp"
#include "touchstone/abi/batch_plan.h"

namespace touchstone::cpu_simd {

void SimdSession::prefill(const int32_t* tokens, int32_t n, bool all_positions, float* logits) {
  if (governed_ && n == 1) {  // a decode step: parallel or solo, as measured (solo_governor.h)
    const bool solo = model_.governor_choose(governor_key_);
    pool_.set_solo(solo);
    const auto t0 = std::chrono::steady_clock::now();
    forward_chunk(tokens, 1, all_positions, logits, 0);
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    model_.governor_record(governor_key_, solo, dt.count());
    pool_.set_solo(false);
    ++decode_steps_[solo];
    return;
  }
  const size_t V = size_t(c_.n_vocab);
  const int32_t start = pos_;
  // prefill_position_reset fault: a prefill continuing a sequence rotates its
  // tokens as positions 0, 1, ... (K/V still written at the right slots).
  const int32_t rope_origin = faults_.prefill_position_reset && n > 1 ? pos_ : 0;
  for (int32_t i = 0; i < n; i += kMaxBatch) {
    const int32_t m = std::min(kMaxBatch, n - i);
    const bool last = i + m == n;
    float* out = all_positions ? logits + size_t(i) * V : last ? logits : nullptr;
    forward_chunk(tokens + i, m, all_positions, out, rope_origin);
  }
  shift_rows(start, n, all_positions, logits, false);
}

void SimdSession::prefill_embeddings(const float* embd, int32_t n, bool bidirectional,
                                     bool all_positions, float* logits) {
  // image_attended_causally fault: the block attended causally, as text.
  bidirectional = bidirectional && !faults_.image_attended_causally;
  // A bidirectional block is one pass: its rows attend one another's K/V in every
  // layer (the pass scratch grown to n rows; a real Gemma 3 image is 256).
  const int32_t step = bidirectional ? n : kMaxBatch;
  if (size_t(step) > pass_cap_) size_pass_scratch(size_t(step));
  const size_t V = size_t(c_.n_vocab), d = size_t(c_.n_embd);
  // image_split_position_reset fault: a call continuing an image rotates its rows from
  // the image's first position again.
  if (!embd_last_) embd_run_ = pos_;
  const bool restart = faults_.image_split_position_reset && embd_last_;
  for (int32_t i = 0; i < n; i += step) {
    const int32_t m = std::min(step, n - i);
    Seg g;
    g.s = this;
    g.embd = embd + size_t(i) * d;
    g.bidirectional = bidirectional;
    g.n = m;
    g.pos = pos_;
    // image_position_offset fault: the block rotated one position later.
    g.rope_pos = (restart ? embd_run_ + i : pos_) + (faults_.image_position_offset ? 1 : 0);
    g.all_positions = all_positions;
    g.logits = all_positions ? logits + size_t(i) * V : (i + m == n ? logits : nullptr);
    forward_pass(&g, 1);
  }
}

// The faults: logits_row_shift (any all-position call), verify_row_shift (one
// that continues a sequence) and batch_all_positions_shift (an entry of a
// step_batch of several) return row i-1 as row i.
void SimdSession::shift_rows(int32_t start_pos, int32_t n, bool all_positions, float* logits,
                             bool in_batch) const {
  const bool shift = faults_.logits_row_shift || (faults_.verify_row_shift && start_pos > 0) ||
                     (faults_.batch_all_positions_shift && in_batch);
  if (!shift || !all_positions || n <= 1) return;
  const size_t V = size_t(c_.n_vocab);
  std::memmove(logits + V, logits, size_t(n - 1) * V * sizeof(float));
}

// One pass computes with the lead's weights, kernels and faults: sessions
// that differ there (fault, int8 mode) cannot share it.
bool SimdSession::batchable_with(const SimdSession& lead) const {
  return &model_ == &lead.model_ && quant_ == lead.quant_ && int8_ == lead.int8_ &&
         faults_.name == lead.faults_.name;
}

void SimdSession::step_batch(std::span<const BatchEntry> e) {
  SimdSession& lead = *e[0].session;
  const bool one_pass = std::all_of(
      e.begin(), e.end(), [&](const BatchEntry& x) { return x.session->batchable_with(lead); });
  if (!one_pass) {
    for (const BatchEntry& x : e) x.session->prefill(x.tokens, x.n, x.all_positions, x.logits);
    return;
  }
  const touchstone::Faults& f = lead.faults_;
  const size_t V = size_t(lead.c_.n_vocab), n = e.size();
  // Per entry: start position and the RoPE position of its first token
  // (prefill_position_reset: from 0; batch_position_offset: + the tokens of
  // the entries before it).
  std::vector<int32_t> start(n), rope0(n);
  int64_t total = 0;
  int32_t ctx = 0;
  for (size_t i = 0; i < n; ++i) {
    SimdSession& s = *e[i].session;
    start[i] = s.pos_;
    const int32_t origin = f.prefill_position_reset && e[i].n > 1 ? s.pos_ : 0;
    rope0[i] = s.pos_ - origin + (f.batch_position_offset ? int32_t(total) : 0);
    total += e[i].n;
    ctx = std::max(ctx, s.max_ctx_);
  }
  lead.reserve_scores(ctx);
  struct SplitOff {
    SimdSession& s;
    ~SplitOff() { s.split_slices_ = 0; }
  } split_off{lead};
  lead.split_slices_ = f.batch_token_count_split ? int32_t(2 + total % 16) : 0;
  // Passes over consecutive ranges of the concatenated tokens.
  std::vector<Seg> segs;
  segs.reserve(kMaxBatch);
  for (const touchstone::PlannedPass& p : touchstone::plan_passes(e, kMaxBatch)) {
    segs.clear();
    for (const touchstone::PassPiece& k : p.pieces) {
      const BatchEntry& x = e[k.entry];
      Seg g;
      g.s = x.session;
      g.tokens = x.tokens + k.offset;
      g.first = k.row0;
      g.n = k.n;
      g.pos = x.session->pos_;
      g.rope_pos = rope0[k.entry] + k.offset;
      g.all_positions = x.all_positions;
      g.logits = x.all_positions ? x.logits + size_t(k.offset) * V
                 : k.completes   ? x.logits
                                 : nullptr;
      if (f.batch_kv_leak && k.entry > 0) {  // the fault: entry i-1's newest KV entry
        g.leak = e[k.entry - 1].session;
        g.leak_pos = start[k.entry - 1] + e[k.entry - 1].n - 1;
      }
      // the batch_page_boundary_leak fault: a page's first row read from entry i-1's cache
      if (f.batch_page_boundary_leak && k.entry > 0) g.page_from = e[k.entry - 1].session;
      segs.push_back(g);
    }
    lead.forward_pass(segs.data(), int(segs.size()));
  }
  for (size_t k = 0; k < n; ++k)
    e[k].session->shift_rows(start[k], e[k].n, e[k].all_positions, e[k].logits, n > 1);
}

std::unique_ptr<SimdSession> SimdSession::fork(int32_t n_prefix) {
  auto f = std::make_unique<SimdSession>(model_, opt_);
  f->pos_ = f->kv_len_ = n_prefix;
  if (faults_.fork_shared_kv) {  // the fault: the fork writes into this session's rows
    f->kv_ = kv_;
    return f;
  }
  // the fork_short_copy fault: the last entry is left zero
  const int32_t n = faults_.fork_short_copy ? std::max(0, n_prefix - 1) : n_prefix;
  const size_t bytes = size_t(n) * size_t(c_.n_head_kv) * size_t(c_.head_dim) * sizeof(float);
  for (int32_t l = 0; l < c_.n_layer; ++l) {
    std::memcpy(f->k_rows(l), k_rows(l), bytes);
    std::memcpy(f->v_rows(l), v_rows(l), bytes);
  }
  return f;
}

}  // namespace touchstone::cpu_simd
