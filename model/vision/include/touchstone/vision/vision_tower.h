// touchstone/vision/vision_tower.h - the vision encoder and projector of a
// vision-language model, read from llama.cpp's mmproj GGUF (general.architecture
// "clip", written by convert_hf_to_gguf.py --mmproj), computed as the reference
// computes text: scalar, every sum in fp64, each operation's output rounded once to
// fp32.
//
// SigLIP vision transformer (HF transformers models/siglip/modeling_siglip.py,
// SiglipVisionTransformer; llama.cpp tools/mtmd/clip.cpp, build_siglip):
//   x_n   = conv2d(pixels, v.patch_embd, stride p)[n] + v.patch_embd.bias + v.position_embd[n]
//           (patch n = (row, col) of the s x s grid, s = image_size / p, row-major)
//   per layer:  x += Wo attn(LN1(x)) + bo;  x += fc2(gelu_tanh(fc1(LN2(x))))
//     attn: q, k, v = W LN1(x) + b per patch; per head softmax(q k^T / sqrt(hd)) v, every
//           patch attending to every patch; LayerNorm (x - mean) / sqrt(var + eps) w + b
//   out   = post_LN(x)                                              [n_patches][n_embd]
// Gemma 3's projector (HF models/gemma3/modeling_gemma3.py, Gemma3MultiModalProjector;
// clip.cpp PROJECTOR_TYPE_GEMMA3):
//   the s x s grid of patch vectors average-pooled in k x k windows (nn.AvgPool2d,
//   k = clip.vision.projector.scale_factor, default 4: 64 x 64 -> 16 x 16 for 896-pixel
//   images), RMSNorm x / sqrt(mean(x^2) + eps) * w (w = 1 + Gemma's weight: the
//   converter stores it plus one), then y = x . W_in, W_in [n_embd][n_embd_text]
//                                                            [n_tokens][n_embd_text]
// Idefics3 / SmolVLM's connector (HF models/idefics3/modeling_idefics3.py,
// Idefics3Connector; clip.cpp PROJECTOR_TYPE_IDEFICS3): pixel shuffle by
// k = clip.vision.projector.scale_factor, token (i, j) of the (s/k) x (s/k) grid being
// the k x k patches (i k + r, j k + c) concatenated in (r, c) order, feature
// (r k + c) n_embd + e; then y = W_fc x (mm.model.fc, no bias). Its tower is SigLIP's;
// Idefics3VisionEmbeddings' position ids (bucketized fractional coordinates) are the
// patch indices for a whole tile, as here (exactly so when 1 / s is exact in binary:
// s = 8, 16, 32, ...; for other s, HF's float32 buckets can differ by one).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "touchstone/vision/preprocess.h"

namespace touchstone::vision {

// The clip.* keys of an mmproj file.
struct VisionTowerConfig {
  std::string projector;  // clip.projector_type ("gemma3", "idefics3")
  int32_t image_size = 0, patch_size = 0;
  int32_t n_embd = 0, n_ff = 0, n_layer = 0, n_head = 0;  // the tower's sizes
  int32_t n_embd_text = 0;                                // clip.vision.projection_dim
  int32_t pool = 4;   // clip.vision.projector.scale_factor (Gemma 3: default 4; Idefics3: 2)
  double eps = 1e-6;  // clip.vision.attention.layer_norm_epsilon
  // clip.vision.preproc_image_size (Idefics3: the processor's size["longest_edge"], as
  // llama.cpp's converter writes it for SmolVLM); 0: absent.
  int32_t longest_edge = 0;
  std::array<double, 3> mean{}, std{};                      // clip.vision.image_mean, image_std
  int32_t grid() const { return image_size / patch_size; }  // patches per side
  int32_t n_patches() const { return grid() * grid(); }
  int32_t n_tokens() const { return (grid() / pool) * (grid() / pool); }  // after pooling
};

// One encoder layer; matrices as stored ([out][in], rows of `in`), fp32.
struct VisionLayer {
  std::vector<float> ln1_w, ln1_b, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;
  std::vector<float> ln2_w, ln2_b, up_w, up_b, down_w, down_b;
};

struct VisionTower {
  std::string path;
  VisionTowerConfig config;
  std::vector<float> patch_w;  // [n_embd][3][p][p] (HF Conv2d weight)
  std::vector<float> patch_b;  // [n_embd]
  std::vector<float> pos;      // [n_patches][n_embd]
  std::vector<VisionLayer> layers;
  std::vector<float> post_w, post_b;  // v.post_ln
  std::vector<float> mm_norm;         // gemma3: mm.soft_emb_norm (1 + w), [n_embd]
  std::vector<float> mm_proj;         // gemma3: mm.input_projection, [n_embd][n_embd_text]
  std::vector<float> mm_fc;           // idefics3: mm.model.fc, [n_embd_text][n_embd * pool * pool]
};

// Reads an mmproj GGUF. Throws touchstone::Error naming the file and the key or tensor
// when it is not an mmproj ("general.architecture" not "clip"), names a projector other
// than gemma3 or idefics3, lacks a key or tensor, or a tensor has the wrong number of
// elements.
VisionTower load_vision_tower(const std::string& path);
// Only its clip.* keys (the tensors are not read), with the same errors for them.
VisionTowerConfig read_vision_config(const std::string& path);

// The image processor the tower's file describes: image_size x image_size, its mean and
// std, rescale 1/255, and the projector family's resampling filter (Gemma 3: bilinear,
// "resample": 2 in google/gemma-3-*-it's preprocessor_config.json). Throws Error for
// Idefics3, whose processor makes several frames (tiles plus a global view):
// touchstone/vision/image_splitting.h.
ImageProcessor processor_of(const VisionTower& tower);
// The same from the keys alone (`path` names the file in errors).
ImageProcessor processor_of(const VisionTowerConfig& config, const std::string& path);

// The tower's output for one image of pixel values (processor_of's size, 3 channels):
// [n_patches][n_embd] fp32. Throws Error on another shape.
std::vector<float> encode_patches(const VisionTower& tower, const PixelValues& pixels);

// The projector on the tower's output: [n_tokens][n_embd_text] fp32, the embeddings the
// decoder takes in place of the image's placeholder tokens.
std::vector<float> project(const VisionTower& tower, const std::vector<float>& patches);

}  // namespace touchstone::vision
