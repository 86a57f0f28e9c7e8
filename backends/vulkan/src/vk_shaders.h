// vk_shaders.h - the SPIR-V blobs embedded at build time (vk_shaders_embedded.cpp,
// generated from shaders/*.comp by glslc + cmake/embed_spirv.cmake).
#pragma once

#include <cstddef>

namespace touchstone::vk {

struct EmbeddedShader {
  const char* name;            // "matmul_q4_1_sg"
  const unsigned char* spirv;  // 4-byte aligned
  size_t size;                 // bytes
};

extern const EmbeddedShader kEmbeddedShaders[];
extern const size_t kEmbeddedShaderCount;

}  // namespace touchstone::vk
