// vk_kernels.cpp - pipelines from embedded SPIR-V, descriptor cache, recorder.
#include "vk_kernels.h"

#include <array>
#include <cstring>

#include "vk_shaders.h"

namespace touchstone::vk {
namespace {

using abi::StatusError;
using gguf::TensorType;

const EmbeddedShader& find_shader(const std::string& name) {
  for (size_t i = 0; i < kEmbeddedShaderCount; ++i) {
    if (name == kEmbeddedShaders[i].name) return kEmbeddedShaders[i];
  }
  throw StatusError(TS_ERR_INTERNAL, "no embedded shader '" + name + "'");
}

}  // namespace

bool shader_reads(TensorType t) {
  return t == TensorType::F32 || t == TensorType::Q4_0 || t == TensorType::Q4_1 ||
         t == TensorType::Q8_0 || t == TensorType::Q5_0 || t == TensorType::Q4_K ||
         t == TensorType::Q5_K || t == TensorType::Q6_K;
}

const char* shader_type_suffix(TensorType t) {
  switch (t) {
    case TensorType::F32:
      return "f32";
    case TensorType::Q4_0:
      return "q4_0";
    case TensorType::Q4_1:
      return "q4_1";
    case TensorType::Q8_0:
      return "q8_0";
    case TensorType::Q5_0:
      return "q5_0";
    case TensorType::Q4_K:
      return "q4_k";
    case TensorType::Q5_K:
      return "q5_k";
    case TensorType::Q6_K:
      return "q6_k";
    default:
      throw StatusError(TS_ERR_UNSUPPORTED,
                        "no shader reads ggml type " + std::to_string(uint32_t(t)));
  }
}

bool ShaderFaults::any() const {
  static_assert(sizeof(ShaderFaults) == kCount * sizeof(uint32_t));
  return rope_layout || kv_write_next || gqa_mapping || softmax_no_max || causal_mask || fp16_out ||
         split_k != 1 || nibble_order || scale_min_swap;
}

Kernels::Kernels(Context& ctx, const ShaderFaults& faults) : ctx_(ctx), faults_(faults) {
  const std::string sg = ctx.use_subgroup() ? "_sg" : "_nosg";
  rows_ = ctx.matmul_row_per_invocation();
  for (const char* t : {"f32", "q4_0", "q4_1", "q8_0", "q5_0", "q4_k", "q5_k", "q6_k"}) {
    add(std::string("matmul_") + t + sg, 3, sizeof(MatmulPush));  // also the rows fallback
    if (rows_) {
      add(std::string("matmul_") + t + "_rows", 3, sizeof(MatmulPush));
      add(std::string("matmul_") + t + "_rows1", 3, sizeof(MatmulPush));
    }
    add(std::string("get_rows_") + t, 3, sizeof(GetRowsPush));
  }
  add("rms_norm" + sg, 3, sizeof(RmsNormPush));
  add("attention" + sg, 6, sizeof(AttentionPush));
  if (rows_ && ctx.info().subgroup_arithmetic) {
    for (uint32_t hd : kAttentionRowsHeadDims)
      add("attention_rows_" + std::to_string(hd), 6, sizeof(AttentionPush));
  }
  add("rope_store", 6, sizeof(RopeStorePush));
  add("glu", 2, sizeof(GluPush));
  add("argmax", 2, sizeof(ArgmaxPush));
  add("bias_add", 2, sizeof(BiasAddPush));
  add("add", 2, sizeof(AddPush));
  add("softcap", 1, sizeof(SoftcapPush));
  add("copy", 2, sizeof(CopyPush));
  add("moe_gather", 3, sizeof(MoeGatherPush));
  add("moe_sum", 4, sizeof(MoeSumPush));
  ctx.check_validation();
}

Kernels::~Kernels() {
  for (auto& [name, k] : kernels_) {
    if (k.pipeline) vkDestroyPipeline(ctx_.device(), k.pipeline, nullptr);
    if (k.layout) vkDestroyPipelineLayout(ctx_.device(), k.layout, nullptr);
    if (k.set_layout) vkDestroyDescriptorSetLayout(ctx_.device(), k.set_layout, nullptr);
  }
}

void Kernels::add(const std::string& shader, uint32_t n_bindings, uint32_t push_size) {
  const EmbeddedShader& s = find_shader(shader);
  Kernel& k = kernels_[shader];
  k.name = shader;
  k.n_bindings = n_bindings;
  k.push_size = push_size;
  VkDevice dev = ctx_.device();

  std::vector<VkDescriptorSetLayoutBinding> b(n_bindings);
  for (uint32_t i = 0; i < n_bindings; ++i) {
    b[i] = VkDescriptorSetLayoutBinding{i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1,
                                        VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  auto dl = vk_struct<VkDescriptorSetLayoutCreateInfo>(
      VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  dl.bindingCount = n_bindings;
  dl.pBindings = b.data();
  check(vkCreateDescriptorSetLayout(dev, &dl, nullptr, &k.set_layout),
        "vkCreateDescriptorSetLayout");

  VkPushConstantRange pr{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_size};
  auto pl = vk_struct<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  pl.setLayoutCount = 1;
  pl.pSetLayouts = &k.set_layout;
  pl.pushConstantRangeCount = 1;
  pl.pPushConstantRanges = &pr;
  check(vkCreatePipelineLayout(dev, &pl, nullptr, &k.layout), "vkCreatePipelineLayout");

  std::vector<uint32_t> words(s.size / 4);
  std::memcpy(words.data(), s.spirv, words.size() * 4);
  auto mi = vk_struct<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
  mi.codeSize = words.size() * 4;
  mi.pCode = words.data();
  VkShaderModule mod = VK_NULL_HANDLE;
  check(vkCreateShaderModule(dev, &mi, nullptr, &mod), "vkCreateShaderModule");
  auto ci = vk_struct<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
  ci.stage = vk_struct<VkPipelineShaderStageCreateInfo>(
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mod;
  ci.stage.pName = "main";
  // Fault pipelines only: the specialization constants of faults.glsl (the
  // shaders' defaults, the correct code, need no specialization info).
  std::array<VkSpecializationMapEntry, ShaderFaults::kCount> entries{};
  VkSpecializationInfo spec{};
  if (faults_.any()) {
    for (uint32_t i = 0; i < ShaderFaults::kCount; ++i)
      entries[i] = VkSpecializationMapEntry{i, i * uint32_t(sizeof(uint32_t)), sizeof(uint32_t)};
    spec =
        VkSpecializationInfo{ShaderFaults::kCount, entries.data(), sizeof(ShaderFaults), &faults_};
    ci.stage.pSpecializationInfo = &spec;
  }
  ci.layout = k.layout;
  const VkResult r = vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &ci, nullptr, &k.pipeline);
  vkDestroyShaderModule(dev, mod, nullptr);
  check(r, ("vkCreateComputePipelines(" + shader + ")").c_str());
}

const Kernel& Kernels::get(const std::string& base, bool has_subgroup_variant) const {
  const std::string name =
      has_subgroup_variant ? base + (ctx_.use_subgroup() ? "_sg" : "_nosg") : base;
  auto it = kernels_.find(name);
  if (it == kernels_.end()) throw StatusError(TS_ERR_INTERNAL, "kernel '" + name + "' not built");
  return it->second;
}

const Kernel& Kernels::matmul(TensorType t, uint32_t n_tok, bool rows) const {
  const std::string base = std::string("matmul_") + shader_type_suffix(t);
  return rows ? get(base + (n_tok == 1 ? "_rows1" : "_rows"), false) : get(base, true);
}
const Kernel& Kernels::attention(uint32_t head_dim) const {
  if (auto it = kernels_.find("attention_rows_" + std::to_string(head_dim)); it != kernels_.end())
    return it->second;
  return get("attention", true);
}
const Kernel& Kernels::get_rows(TensorType t) const {
  return get(std::string("get_rows_") + shader_type_suffix(t), false);
}

DescriptorCache::~DescriptorCache() {
  for (VkDescriptorPool p : pools_) vkDestroyDescriptorPool(ctx_.device(), p, nullptr);
}

VkDescriptorSet DescriptorCache::get(const Kernel& k, const std::vector<BufferRange>& buffers) {
  if (buffers.size() != k.n_bindings) {
    throw StatusError(TS_ERR_INTERNAL, k.name + ": " + std::to_string(buffers.size()) +
                                           " buffers for " + std::to_string(k.n_bindings) +
                                           " bindings");
  }
  std::vector<uint64_t> ids;
  for (const BufferRange& b : buffers) {
    ids.push_back(b.buf->serial());
    ids.push_back(b.offset);
    ids.push_back(b.size);
  }
  auto key = std::make_pair(&k, ids);
  if (auto it = sets_.find(key); it != sets_.end()) return it->second;

  constexpr uint32_t kSetsPerPool = 256, kMaxBindings = 8;
  if (left_in_pool_ == 0) {
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerPool * kMaxBindings};
    auto pi = vk_struct<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
    pi.maxSets = kSetsPerPool;
    pi.poolSizeCount = 1;
    pi.pPoolSizes = &size;
    VkDescriptorPool pool = VK_NULL_HANDLE;
    check(vkCreateDescriptorPool(ctx_.device(), &pi, nullptr, &pool), "vkCreateDescriptorPool");
    pools_.push_back(pool);
    left_in_pool_ = kSetsPerPool;
  }
  auto ai = vk_struct<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
  ai.descriptorPool = pools_.back();
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &k.set_layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  check(vkAllocateDescriptorSets(ctx_.device(), &ai, &set), "vkAllocateDescriptorSets");
  --left_in_pool_;

  std::vector<VkDescriptorBufferInfo> infos(buffers.size());
  std::vector<VkWriteDescriptorSet> writes(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    infos[i] = VkDescriptorBufferInfo{buffers[i].buf->handle(), buffers[i].offset, buffers[i].size};
    writes[i] = vk_struct<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
    writes[i].dstSet = set;
    writes[i].dstBinding = uint32_t(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(ctx_.device(), uint32_t(writes.size()), writes.data(), 0, nullptr);
  sets_.emplace(std::move(key), set);
  return set;
}

void Recorder::dispatch_raw(const Kernel& k, const std::vector<BufferRange>& buffers,
                            const void* push, size_t push_size, uint32_t gx, uint32_t gy,
                            uint32_t gz) {
  if (push_size != k.push_size)
    throw StatusError(TS_ERR_INTERNAL, k.name + ": push constant size mismatch");
  if (gx == 0 || gy == 0 || gz == 0) return;
  const VkDescriptorSet set = sets_.get(k, buffers);
  vkCmdBindPipeline(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, k.pipeline);
  vkCmdBindDescriptorSets(cb_, VK_PIPELINE_BIND_POINT_COMPUTE, k.layout, 0, 1, &set, 0, nullptr);
  vkCmdPushConstants(cb_, k.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, uint32_t(push_size), push);
  vkCmdDispatch(cb_, gx, gy, gz);
  if (prof_) prof_->mark(cb_, k.name + " " + std::to_string(gx * gz) + "x" + std::to_string(gy));
}

void Recorder::barrier() {
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

void Recorder::host_barrier() {
  auto mb = vk_struct<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cb_, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                       &mb, 0, nullptr, 0, nullptr);
}

void record_matmul(Recorder& r, const Kernels& k, TensorType wtype, const BufferRange& w,
                   const Buffer& x, const Buffer& y, const MatmulPush& p) {
  // matmul_rows.comp reads X as vec4 in blocks of 32 elements; other shapes use matmul.comp.
  const bool rows =
      k.matmul_row_per_invocation() && p.n_in % 32 == 0 && p.x_off % 4 == 0 && p.x_stride % 4 == 0;
  const uint32_t rows_per_group = rows ? kMatmulRowsPerGroup : 1;
  const uint32_t groups = (p.n_out + rows_per_group - 1) / rows_per_group;
  const uint32_t gx = groups < kMatmulRowsPerX ? groups : kMatmulRowsPerX;
  const uint32_t gz = (groups + kMatmulRowsPerX - 1) / kMatmulRowsPerX;
  const uint32_t gy = (p.n_tok + kMatmulTile - 1) / kMatmulTile;
  r.dispatch(k.matmul(wtype, p.n_tok, rows), {w, &x, &y}, p, gx, gy, gz);
}

}  // namespace touchstone::vk
