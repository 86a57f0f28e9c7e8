// vk_experts.cpp - a mixture-of-experts tensor (GGUF 3-D {n_in, n_out, n_expert},
// llama.cpp's ffn_{gate,up,down}_exps) -> device slabs (vk_weights.h: DeviceExperts).
// Each expert's rows go up in the format a dense matrix of the same type gets
// (vk_weight_rows.h): the blocks as stored, in the split or padded layout, or fp32.
#include <algorithm>
#include <string>
#include <vector>

#include "vk_weight_rows.h"
#include "vk_weights.h"

namespace touchstone::vk {
namespace {

using abi::StatusError;

const gguf::TensorInfo& expert_tensor(const gguf::File& f, const std::string& name, uint64_t n_in,
                                      uint64_t n_out, uint64_t n_expert) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw StatusError(TS_ERR_IO, f.path() + ": tensor '" + name + "' missing");
  if (t->shape != std::vector<uint64_t>{n_in, n_out, n_expert}) {
    throw StatusError(TS_ERR_IO, f.path() + ": tensor '" + name +
                                     "' has an unexpected shape (want " + std::to_string(n_in) +
                                     " x " + std::to_string(n_out) + " x " +
                                     std::to_string(n_expert) + ")");
  }
  return *t;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

std::vector<uint64_t> plan_expert_slabs(DeviceExperts& m, size_t n_expert, size_t per_part,
                                        uint64_t dev_row, uint64_t cap, uint64_t align) {
  std::vector<uint64_t> sizes{0};
  m.experts.assign(n_expert, {});
  for (size_t e = 0; e < n_expert; ++e) {
    for (uint32_t r = 0; r < m.n_out; r += uint32_t(per_part)) {
      ExpertPart p;
      p.row0 = r;
      p.n_rows = std::min(uint32_t(per_part), m.n_out - r);
      p.bytes = uint64_t{p.n_rows} * dev_row;
      p.offset = align_up(sizes.back(), align);
      if (p.offset + p.bytes > cap && sizes.back() > 0) {  // the slab is full: a new one
        sizes.push_back(0);
        p.offset = 0;
      }
      p.slab = uint32_t(sizes.size() - 1);
      sizes.back() = p.offset + p.bytes;
      m.experts[e].push_back(p);
    }
  }
  return sizes;
}

DeviceExperts upload_experts(Context& ctx, const gguf::File& f, const std::string& name,
                             int64_t n_in, int64_t n_out, int64_t n_expert, bool quantized,
                             uint64_t& total) {
  const gguf::TensorInfo& t =
      expert_tensor(f, name, uint64_t(n_in), uint64_t(n_out), uint64_t(n_expert));
  DeviceExperts m;
  m.n_in = uint32_t(n_in);
  m.n_out = uint32_t(n_out);
  m.type = device_type(t, size_t(n_in), quantized);
  const size_t row_bytes = file_row_bytes(t, size_t(n_in));
  const uint8_t* data = f.tensor_data(t).data();
  const size_t dev_row = device_row_bytes(t, m.type, data, size_t(n_in));
  const std::vector<uint64_t> sizes =
      plan_expert_slabs(m, size_t(n_expert), rows_per_part(ctx, dev_row), dev_row,
                        ctx.info().max_storage_buffer_range,
                        std::max<uint64_t>(4, ctx.info().min_storage_buffer_offset_alignment));
  for (uint64_t bytes : sizes) {
    m.slabs.emplace_back(ctx, size_t(bytes), Buffer::Kind::Device);
    total += bytes;
  }
  for (size_t e = 0; e < m.experts.size(); ++e) {
    for (const ExpertPart& p : m.experts[e]) {
      const uint8_t* first = data + (e * size_t(n_out) + p.row0) * row_bytes;
      const std::vector<uint8_t> dev =
          device_rows(t, m.type, first, row_bytes, size_t(n_in), p.n_rows);
      m.slabs[p.slab].upload(dev.data(), dev.size(), size_t(p.offset));
    }
  }
  return m;
}

}  // namespace touchstone::vk
