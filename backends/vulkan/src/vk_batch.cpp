// vk_batch.cpp - ABI v6 serving on the device: step_batch (the entries' tokens
// in passes of up to kChunk rows, one command buffer each) and fork (the KV
// prefix copied on the device), with the serving faults that live there.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "touchstone/abi/batch_plan.h"
#include "vk_forward.h"

namespace touchstone::vk {
namespace {

// Shader and transfer accesses before -> both after (the page leak's copies
// sit between the KV store and the attention of a layer).
void transfer_barrier(VkCommandBuffer cb) {
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                     VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  const VkPipelineStageFlags st =
      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
  vkCmdPipelineBarrier(cb, st, st, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

void copy_row(VkCommandBuffer cb, const Buffer& src, VkDeviceSize src_off, const Buffer& dst,
              VkDeviceSize dst_off, VkDeviceSize bytes) {
  const VkBufferCopy region{src_off, dst_off, bytes};
  vkCmdCopyBuffer(cb, src.handle(), dst.handle(), 1, &region);
}

}  // namespace

// A segment holds at most one page boundary (kChunk rows, pages of
// kFaultPageRows): position p > 0, p % kFaultPageRows == 0, inside the
// segment and inside page_from's cache. Its K and V rows of layer l are saved
// to page_save_ and replaced by page_from's before the attention, and put back
// after it, so the queries of this pass at p and later read entry i-1's row
// (cpu_simd's fault reads it for the query at p only; both break batch
// invariance from p on).
void Forward::record_page_leak(Recorder& r, const Pass& p, size_t l, bool restore) const {
  static_assert(kChunk <= Faults::kFaultPageRows, "a segment must hold one page boundary at most");
  const uint32_t page = uint32_t(Faults::kFaultPageRows);
  const VkDeviceSize row =
      VkDeviceSize(w_.config.n_head_kv) * VkDeviceSize(w_.config.head_dim) * sizeof(float);
  VkCommandBuffer cb = r.handle();
  std::vector<std::pair<const Segment*, VkDeviceSize>> hits;
  for (const Segment& s : p.segs) {
    const uint32_t at = (s.pos0 + page - 1) / page * page;  // first boundary >= pos0
    if (s.page_from && at > 0 && at < s.pos0 + s.n && at < uint32_t(s.page_from->max_ctx_))
      hits.emplace_back(&s, VkDeviceSize(at) * row);
  }
  if (hits.empty()) return;
  transfer_barrier(cb);  // the store (or the attention) before the copies
  for (const auto& [s, off] : hits) {
    const Forward& f = *s->f;
    if (restore) {
      copy_row(cb, f.page_save_, 0, f.kv_->k[l], off, row);
      copy_row(cb, f.page_save_, row, f.kv_->v[l], off, row);
    } else {
      copy_row(cb, f.kv_->k[l], off, f.page_save_, 0, row);
      copy_row(cb, f.kv_->v[l], off, f.page_save_, row, row);
    }
  }
  if (!restore) {
    // Segments are in entry order: the last entry first, each copy finished
    // before its source is overwritten, so each reads entry i-1's own row.
    for (auto it = hits.rbegin(); it != hits.rend(); ++it) {
      const auto& [s, off] = *it;
      transfer_barrier(cb);  // saved (or read by the next entry) before overwritten
      copy_row(cb, s->page_from->kv_->k[l], off, s->f->kv_->k[l], off, row);
      copy_row(cb, s->page_from->kv_->v[l], off, s->f->kv_->v[l], off, row);
    }
  }
  transfer_barrier(cb);  // the copies before the attention (or the next layer)
}

std::unique_ptr<Forward> Forward::fork(int32_t n_prefix) const {
  auto f = std::make_unique<Forward>(ctx_, base_kernels_, w_, max_ctx_, faults_, n_threads_);
  if (faults_.fork_shared_kv) {  // the fault: the fork writes into this sequence's buffers
    f->kv_ = kv_;
    f->pos_ = f->kv_len_ = n_prefix;
    return f;
  }
  const size_t kv_dim = size_t(w_.config.n_head_kv) * size_t(w_.config.head_dim);
  // kv_write_next stores position p in row p + 1 (row 0 stays zero).
  const size_t rows = size_t(n_prefix) + (faults_.kv_write_next ? 1 : 0);
  // The fork_short_copy fault: the last entry is not copied but zeroed.
  const size_t copied = faults_.fork_short_copy && n_prefix > 0 ? rows - 1 : rows;
  const VkDeviceSize row_bytes = kv_dim * sizeof(float);
  ctx_.run([&](VkCommandBuffer cb) {
    for (size_t l = 0; l < kv_->k.size(); ++l) {
      for (const bool is_k : {true, false}) {
        const Buffer& src = (is_k ? kv_->k : kv_->v)[l];
        const Buffer& dst = (is_k ? f->kv_->k : f->kv_->v)[l];
        if (copied > 0) {
          const VkBufferCopy region{0, 0, copied * row_bytes};
          vkCmdCopyBuffer(cb, src.handle(), dst.handle(), 1, &region);
        }
        if (copied < rows) vkCmdFillBuffer(cb, dst.handle(), copied * row_bytes, row_bytes, 0);
      }
    }
    // Transfer writes -> the shaders of later submissions.
    auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                         0, 1, &mb, 0, nullptr, 0, nullptr);
  });
  f->pos_ = f->kv_len_ = n_prefix;
  ctx_.check_validation();
  return f;
}

void Forward::step_batch(BatchWorkspace& ws, std::span<const BatchEntry> e) {
  Forward& lead = *e[0].f;
  // One pass computes with the lead's kernels and faults: entries whose fault
  // differs run alone.
  const bool one_pass = std::all_of(e.begin(), e.end(), [&](const BatchEntry& x) {
    return x.f->faults_.name == lead.faults_.name && &x.f->w_ == &lead.w_;
  });
  if (!one_pass) {
    for (const BatchEntry& x : e) x.f->prefill(x.tokens, x.n, x.all_positions, x.logits);
    return;
  }
  const Faults& flt = lead.faults_;
  const size_t v = size_t(lead.w_.config.n_vocab);
  std::lock_guard<std::mutex> lock(ws.mutex);
  uint32_t stride = 1;
  std::vector<int32_t> start, rope_off;
  int32_t total = 0;
  for (const BatchEntry& x : e) {
    stride = std::max(stride, uint32_t(x.f->max_ctx_));
    start.push_back(x.f->pos_);
    // batch_position_offset fault: entry i > 0 rotates as if flattened after
    // the tokens of the entries before it (kept inside its RoPE table).
    const bool offset = flt.batch_position_offset && total + x.f->pos_ + x.n <= x.f->max_ctx_;
    rope_off.push_back(offset ? total : 0);
    total += x.n;
  }
  ws.act.reserve_scores(lead.ctx_, lead.w_.config, stride);
  std::vector<Segment> segs;
  std::vector<int32_t> tokens;
  for (const PlannedPass& pl : plan_passes(e, kChunk)) {
    segs.clear();
    tokens.clear();
    bool tap = false;
    for (const PassPiece& k : pl.pieces) {
      const BatchEntry& x = e[k.entry];
      Forward& f = *x.f;
      // prefill_position_reset fault: a prefill continuing a sequence rotates
      // from position 0 (as in prefill()).
      f.rope_origin_ = flt.prefill_position_reset && x.n > 1 ? uint32_t(start[k.entry]) : 0u;
      f.rope_origin_ -= uint32_t(rope_off[k.entry]);
      segs.push_back(f.segment(uint32_t(k.row0), uint32_t(k.n), uint32_t(k.out_rows),
                               uint32_t(k.out_row0), f.taps_on_ && k.completes));
      // batch_page_boundary_leak fault: a page's first row read from entry i-1's cache
      if (flt.batch_page_boundary_leak && k.entry > 0) segs.back().page_from = e[k.entry - 1].f;
      f.rope_origin_ = 0;
      tokens.insert(tokens.end(), x.tokens + k.offset, x.tokens + k.offset + k.n);
      tap = tap || segs.back().tap;
    }
    const Pass p{ws.act, ws.sets, segs, uint32_t(pl.rows), uint32_t(pl.out_rows), false, tap};
    lead.run_pass(tokens.data(), p);
    for (size_t k = 0; k < segs.size(); ++k) {
      const PassPiece& piece = pl.pieces[k];
      const BatchEntry& x = e[piece.entry];
      if (piece.out_rows == 0) continue;
      float* dst = x.all_positions ? x.logits + size_t(piece.offset) * v : x.logits;
      lead.copy_logits(p, segs[k], dst);
    }
  }
  for (size_t k = 0; k < e.size(); ++k)
    e[k].f->shift_rows(start[k], e[k].n, e[k].all_positions, e[k].logits, e.size() > 1);
}

}  // namespace touchstone::vk
