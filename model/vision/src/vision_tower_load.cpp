// vision_tower_load.cpp - an mmproj GGUF (llama.cpp's clip layout) into a VisionTower
// (touchstone/vision/vision_tower.h). Key and tensor names: llama.cpp
// tools/mtmd/clip-impl.h (KEY_*, TN_*), as convert_hf_to_gguf.py --mmproj writes them.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "touchstone/common/error.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/quant.h"
#include "touchstone/vision/vision_tower.h"

namespace touchstone::vision {
namespace {

// A positive clip.vision.* size.
int32_t size_key(const gguf::File& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  if (v < 1 || v > (int64_t{1} << 24))
    throw Error("{}: {} = {}: expected a positive size", f.path(), key, v);
  return int32_t(v);
}

std::array<double, 3> rgb_key(const gguf::File& f, const std::string& key) {
  const std::vector<double> v = f.get_float_array(key);
  if (v.size() != 3) throw Error("{}: {} has {} values, expected 3 (RGB)", f.path(), key, v.size());
  return {v[0], v[1], v[2]};
}

// Tensor `name` dequantized to fp32 (F32, F16 and the block types gguf::dequantize reads),
// which must hold n values.
std::vector<float> tensor(const gguf::File& f, const std::string& name, size_t n) {
  std::vector<float> v = gguf::dequantize(f, f.tensor(name));
  if (v.size() != n)
    throw Error("{}: tensor {} has {} values, expected {}", f.path(), name, v.size(), n);
  return v;
}

VisionTowerConfig read_config(const gguf::File& f) {
  const std::string arch = f.get_string("general.architecture");
  if (arch != "clip")
    throw Error("{}: general.architecture = '{}': not an mmproj file (expected 'clip')", f.path(),
                arch);
  if (f.find_bool("clip.has_vision_encoder") == false)
    throw Error("{}: clip.has_vision_encoder is false (an audio mmproj?)", f.path());
  VisionTowerConfig c;
  c.projector = f.get_string("clip.projector_type");
  if (c.projector != "gemma3" && c.projector != "idefics3")
    throw Error("{}: clip.projector_type = '{}': not supported (supported: gemma3, idefics3)",
                f.path(), c.projector);
  c.image_size = size_key(f, "clip.vision.image_size");
  c.patch_size = size_key(f, "clip.vision.patch_size");
  c.n_embd = size_key(f, "clip.vision.embedding_length");
  c.n_ff = size_key(f, "clip.vision.feed_forward_length");
  c.n_layer = size_key(f, "clip.vision.block_count");
  c.n_head = size_key(f, "clip.vision.attention.head_count");
  c.n_embd_text = size_key(f, "clip.vision.projection_dim");
  if (f.has("clip.vision.projector.scale_factor"))
    c.pool = size_key(f, "clip.vision.projector.scale_factor");
  if (f.has("clip.vision.preproc_image_size"))
    c.longest_edge = size_key(f, "clip.vision.preproc_image_size");
  c.eps = f.get_float("clip.vision.attention.layer_norm_epsilon");
  c.mean = rgb_key(f, "clip.vision.image_mean");
  c.std = rgb_key(f, "clip.vision.image_std");
  if (c.image_size % c.patch_size || c.grid() % c.pool || c.n_embd % c.n_head)
    throw Error(
        "{}: image_size {} / patch_size {} / scale_factor {} / head_count {}: the patch grid "
        "must divide into whole patches and pooling windows, the width into whole heads",
        f.path(), c.image_size, c.patch_size, c.pool, c.n_head);
  return c;
}

VisionLayer read_layer(const gguf::File& f, const VisionTowerConfig& c, int32_t l) {
  const size_t d = size_t(c.n_embd), ff = size_t(c.n_ff);
  auto t = [&](const char* part, size_t n) {
    return tensor(f, fmt::format("v.blk.{}.{}", l, part), n);
  };
  VisionLayer L;
  L.ln1_w = t("ln1.weight", d);
  L.ln1_b = t("ln1.bias", d);
  L.q_w = t("attn_q.weight", d * d);
  L.q_b = t("attn_q.bias", d);
  L.k_w = t("attn_k.weight", d * d);
  L.k_b = t("attn_k.bias", d);
  L.v_w = t("attn_v.weight", d * d);
  L.v_b = t("attn_v.bias", d);
  L.o_w = t("attn_out.weight", d * d);
  L.o_b = t("attn_out.bias", d);
  L.ln2_w = t("ln2.weight", d);
  L.ln2_b = t("ln2.bias", d);
  L.up_w = t("ffn_up.weight", ff * d);
  L.up_b = t("ffn_up.bias", ff);
  L.down_w = t("ffn_down.weight", d * ff);
  L.down_b = t("ffn_down.bias", d);
  return L;
}

}  // namespace

VisionTowerConfig read_vision_config(const std::string& path) {
  return read_config(gguf::File::open_metadata(path));
}

VisionTower load_vision_tower(const std::string& path) {
  const gguf::File f = gguf::File::open(path);
  VisionTower t;
  t.path = path;
  t.config = read_config(f);
  const VisionTowerConfig& c = t.config;
  const size_t d = size_t(c.n_embd), p = size_t(c.patch_size);
  t.patch_w = tensor(f, "v.patch_embd.weight", d * 3 * p * p);
  t.patch_b = tensor(f, "v.patch_embd.bias", d);
  t.pos = tensor(f, "v.position_embd.weight", size_t(c.n_patches()) * d);
  for (int32_t l = 0; l < c.n_layer; ++l) t.layers.push_back(read_layer(f, c, l));
  t.post_w = tensor(f, "v.post_ln.weight", d);
  t.post_b = tensor(f, "v.post_ln.bias", d);
  const size_t dt = size_t(c.n_embd_text);
  if (c.projector == "gemma3") {
    t.mm_norm = tensor(f, "mm.soft_emb_norm.weight", d);
    t.mm_proj = tensor(f, "mm.input_projection.weight", d * dt);
  } else {
    t.mm_fc = tensor(f, "mm.model.fc.weight", dt * d * size_t(c.pool) * size_t(c.pool));
  }
  return t;
}

ImageProcessor processor_of(const VisionTower& tower) {
  return processor_of(tower.config, tower.path);
}

ImageProcessor processor_of(const VisionTowerConfig& c, const std::string& path) {
  if (c.projector != "gemma3")
    throw Error(
        "{}: the {} image processor makes several frames (tiles and a global view): "
        "split_image (touchstone/vision/image_splitting.h), not one resize",
        path, c.projector);
  ImageProcessor p;
  p.name = c.projector;
  p.width = p.height = c.image_size;
  p.resample = Filter::Bilinear;
  p.rescale_factor = 0.00392156862745098;  // preprocessor_config.json's 1/255
  p.mean = c.mean;
  p.std = c.std;
  return p;
}

}  // namespace touchstone::vision
