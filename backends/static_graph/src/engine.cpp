// engine.cpp - weight packing, bucket planning and the session token loop.
#include "engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <thread>

#include "kquant_pack.h"
#include "touchstone/abi/backend_impl.h"
#include "touchstone/common/error.h"
#include "touchstone/model/faults.h"
#include "touchstone/model/gguf.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/rope_yarn.h"
#include "touchstone/model/scalar_ops.h"

namespace touchstone::static_graph {

size_t elem_size(const std::string& e) {
  if (e == "f32" || e == "i32") return 4;
  if (e == "f16") return 2;
  if (e == "i8") return 1;
  throw std::logic_error("elem_size: " + e);
}

HostTensor HostTensor::make(std::vector<int64_t> shape, const std::string& elem) {
  HostTensor t;
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  t.bytes = n * elem_size(elem);
  const size_t alloc = (t.bytes + 63) / 64 * 64 + 64;
  void* p = std::aligned_alloc(64, alloc);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, alloc);
  t.data = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
  t.shape = std::move(shape);
  t.elem = elem;
  return t;
}

namespace {

using gguf::TensorType;

// Rows [row0, row0 + out) of fp32 [rows][in] -> [1][in][out] (row0: a fused
// tensor's part); count > 1: `count` stacked matrices of `out` rows each (experts,
// [count][out][in]) -> [count][in][out].
HostTensor transpose_f32(const std::vector<float>& w, int64_t out, int64_t in, int64_t row0 = 0,
                         int64_t count = 1) {
  HostTensor t = HostTensor::make({count, in, out}, "f32");
  float* d = t.as<float>();
  for (int64_t e = 0; e < count; ++e)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        d[(e * in + i) * out + o] = w[size_t((row0 + e * out + o) * in + i)];
  return t;
}

HostTensor vec_f32(const std::vector<float>& v) {
  HostTensor t = HostTensor::make({1, int64_t(v.size())}, "f32");
  std::memcpy(t.data.get(), v.data(), v.size() * 4);
  return t;
}

// A quantized-only fault as a bug of this packer (test only): quant_scale_min_swap
// stores a Q4_1 block's d where its m belongs and m where d belongs; nibble_order
// stores every qs byte with its low and high 4-bit quants swapped (Q4_0, Q4_1).
struct PackFault {
  bool swap_dm = false, swap_nibbles = false;
};

// Repacks a GGUF block matrix (rows = out, blocks along in) into the graph's
// transposed block layout: Q4_0/Q4_1/Q8_0 here (qs [nb][16|32][out], d/m
// [nb][1][out] as raw fp16 bits), Q5_0/Q5_1/K-quants in pack_kquant, F32/F16
// as an fp32 [1][in][out] matrix; sets fmt (graph.h). Throws
// StatusError(TS_ERR_UNSUPPORTED) for any other type. Returns whether the pack
// fault (if any) changed this matrix. row0: the first row taken (a fused
// tensor's part: rows [row0, row0 + out)).
bool pack_blocks(const gguf::File& f, const gguf::TensorInfo& ti, const std::string& name,
                 int64_t in, int64_t out, WeightSet& ws, MatrixFormat& fmt,
                 const PackFault& pf = {}, int64_t row0 = 0) {
  const auto raw = f.tensor_data(ti);
  const int64_t nb = in / 32;
  auto put = [&](const std::string& k, HostTensor t) {
    ws.bytes += t.bytes;
    ws.tensors[k] = std::move(t);
  };
  if (ti.type == TensorType::Q4_1 || ti.type == TensorType::Q4_0) {
    const bool q41 = ti.type == TensorType::Q4_1;
    fmt = q41 ? MatrixFormat::Q4_1 : MatrixFormat::Q4_0;
    HostTensor qs = HostTensor::make({nb, 16, out}, "i8"),
               d = HostTensor::make({nb, 1, out}, "f16");
    HostTensor mn = q41 ? HostTensor::make({nb, 1, out}, "f16") : HostTensor{};
    const size_t bsz = q41 ? sizeof(gguf::block_q4_1) : sizeof(gguf::block_q4_0);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = raw.data() + size_t((row0 + o) * nb + b) * bsz;
        uint16_t dh, mh = 0;
        std::memcpy(&dh, blk, 2);
        if (q41) std::memcpy(&mh, blk + 2, 2);
        if (pf.swap_dm && q41) std::swap(dh, mh);  // the fault
        const uint8_t* q = blk + (q41 ? 4 : 2);
        d.as<uint16_t>()[b * out + o] = dh;
        if (q41) mn.as<uint16_t>()[b * out + o] = mh;
        uint8_t* dst = qs.as<uint8_t>() + b * 16 * out + o;
        for (int j = 0; j < 16; ++j) {
          dst[j * out] = pf.swap_nibbles ? uint8_t((q[j] >> 4) | (q[j] << 4)) : q[j];  // fault
        }
      }
    }
    put(name + ".qs", qs);
    put(name + ".d", d);
    if (q41) put(name + ".m", mn);
    return pf.swap_nibbles || (pf.swap_dm && q41);
  } else if (ti.type == TensorType::Q8_0) {
    fmt = MatrixFormat::Q8_0;
    HostTensor qs = HostTensor::make({nb, 32, out}, "i8"),
               d = HostTensor::make({nb, 1, out}, "f16");
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = raw.data() + size_t((row0 + o) * nb + b) * sizeof(gguf::block_q8_0);
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        d.as<uint16_t>()[b * out + o] = dh;
        for (int j = 0; j < 32; ++j) qs.as<uint8_t>()[(b * 32 + j) * out + o] = blk[2 + j];
      }
    }
    put(name + ".qs", qs);
    put(name + ".d", d);
    return false;  // no 4-bit quants, no min
  }
  if (pack_kquant(f, ti, name, in, out, row0, ws, fmt)) return false;  // no packing fault there
  if (ti.type == TensorType::F32 || ti.type == TensorType::F16) {  // widened exactly, used as fp32
    fmt = MatrixFormat::F32;
    put(name, transpose_f32(gguf::dequantize(f, ti), out, in, row0));
    return false;
  }
  throw abi::StatusError(
      TS_ERR_UNSUPPORTED,
      "quantized path: tensor " + ti.name + " has type " + std::string(gguf::type_name(ti.type)) +
          " (supported in graph: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, "
          "MXFP4)");
}

void put_tensor(WeightSet& ws, const std::string& k, HostTensor t) {
  ws.bytes += t.bytes;
  ws.tensors[k] = std::move(t);
}

// Where matrix k (LayerMatrix) of layer l is stored: the tensor and its first row
// (Phi-3's fused tensors, split at load as the reference does: attn_qkv rows
// [q | k | v], ffn_up rows [gate | up]; the experts of a 3-D tensor follow each other,
// `out` rows each).
struct MatrixSource {
  std::string tensor;
  int64_t row0 = 0;
};

MatrixSource matrix_source(const ModelConfig& c, const ModelDims& D, int32_t l, int k) {
  const std::string p = "blk." + std::to_string(l) + ".";
  const int64_t qd = int64_t(c.n_head) * c.head_dim, kvd = int64_t(c.n_head_kv) * c.head_dim;
  if (c.fused_qkv && k < 3) return {p + "attn_qkv.weight", k == 0 ? 0 : k == 1 ? qd : qd + kvd};
  if (c.fused_gate_up && (k == kFfnGate || k == kFfnUp))
    return {p + "ffn_up.weight", k == kFfnGate ? 0 : c.n_ff};
  return {p + layer_matrix_name(D, k) + ".weight", 0};
}

// GGUF name of a layer vector's graph argument ("attn_q.bias" stays, norms get ".weight").
std::string vector_tensor(const std::string& prefix, const std::string& name) {
  return prefix + name + (name.size() > 5 && name.ends_with(".bias") ? "" : ".weight");
}

// The norms and biases of every layer (f32 [1, n]) and output_norm.
void put_vectors(const gguf::File& f, const ModelConfig& c, const ModelDims& D, WeightSet& ws) {
  auto put = [&](const std::string& key, const std::string& tensor, int64_t n) {
    std::vector<float> v = gguf::dequantize(f, f.tensor(tensor));
    if (int64_t(v.size()) != n)
      throw abi::StatusError(TS_ERR_IO, f.path() + ": tensor " + tensor + " has the wrong size");
    put_tensor(ws, key, vec_f32(v));
  };
  put("output_norm", "output_norm.weight", D.n_embd);
  for (int32_t l = 0; l < D.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    put(p + "attn_norm", p + "attn_norm.weight", D.n_embd);
    put(p + "ffn_norm", p + ffn_norm_tensor(c), D.n_embd);
    for (const VectorArg& v : layer_vectors(D)) put(p + v.name, vector_tensor(p, v.name), v.n);
  }
}

// full_precision: one tensor dequantized at a time (a fused one once for its
// parts), then transposed into its graph layout: the load's peak is one fp32
// matrix above the packed set (a whole dequantized ModelWeights beside it
// doubled the peak RSS).
std::unique_ptr<WeightSet> load_full_precision(const gguf::File& f, const ModelConfig& c,
                                               const ModelDims& D) {
  auto ws = std::make_unique<WeightSet>();
  ws->spec_template.mode = WeightMode::FullPrecision;
  auto put = [&](const std::string& k, HostTensor t) { put_tensor(*ws, k, std::move(t)); };
  std::string held_name;  // the last tensor dequantized, kept for a fused tensor's next part
  std::vector<float> held;
  auto deq = [&](const std::string& name, int64_t n) -> const std::vector<float>& {
    if (name == held_name) return held;
    held = gguf::dequantize(f, f.tensor(name));
    held_name = name;
    if (int64_t(held.size()) < n) {
      throw abi::StatusError(TS_ERR_IO, f.path() + ": tensor " + name + " has " +
                                            std::to_string(held.size()) + " elements, expected " +
                                            std::to_string(n));
    }
    return held;
  };
  const int64_t E = D.n_embd;
  {
    const std::vector<float>& emb = deq("token_embd.weight", int64_t(D.n_vocab) * E);
    HostTensor t = HostTensor::make({1, D.n_vocab, E}, "f32");
    std::memcpy(t.data.get(), emb.data(), t.bytes);
    put("token_embd", std::move(t));
    if (c.tied_embeddings) put("lm_head", transpose_f32(emb, D.n_vocab, E));
  }
  if (!c.tied_embeddings) {
    put("lm_head", transpose_f32(deq("output.weight", int64_t(D.n_vocab) * E), D.n_vocab, E));
  }
  put_vectors(f, c, D, *ws);
  for (int32_t l = 0; l < D.n_layer; ++l) {
    for (int k = 0; k < kLayerMatrices; ++k) {
      const auto [in, out, count] = layer_matrix_shape(D, k);
      if (count == 0) continue;
      const MatrixSource src = matrix_source(c, D, l, k);
      const std::string key = "blk." + std::to_string(l) + "." + layer_matrix_name(D, k);
      put(key,
          transpose_f32(deq(src.tensor, (src.row0 + count * out) * in), out, in, src.row0, count));
    }
  }
  return ws;
}

// `count` matrices of `out` rows each from rows row0.. of one tensor (a 3-D expert
// tensor), each repacked by pack_blocks, stacked along the first dim of every part
// (blocks [count * nb][r][out], fp32 [count][in][out]). Returns whether the pack
// fault changed them.
bool pack_stacked(const gguf::File& f, const gguf::TensorInfo& ti, const std::string& name,
                  int64_t in, int64_t out, int64_t count, WeightSet& ws, MatrixFormat& fmt,
                  const PackFault& pf, int64_t row0) {
  if (ti.type == TensorType::F32 || ti.type == TensorType::F16) {  // as pack_blocks: fp32
    fmt = MatrixFormat::F32;
    put_tensor(ws, name, transpose_f32(gguf::dequantize(f, ti), out, in, row0, count));
    return false;
  }
  std::vector<WeightSet> parts(static_cast<size_t>(count));
  bool changed = false;
  for (int64_t e = 0; e < count; ++e)
    changed |= pack_blocks(f, ti, name, in, out, parts[size_t(e)], fmt, pf, row0 + e * out);
  for (const auto& [key, first] : parts[0].tensors) {
    std::vector<int64_t> shape = first.shape;
    shape[0] *= count;
    HostTensor t = HostTensor::make(shape, first.elem);
    for (int64_t e = 0; e < count; ++e)
      std::memcpy(t.data.get() + size_t(e) * first.bytes,
                  parts[size_t(e)].tensors.at(key).data.get(), first.bytes);
    put_tensor(ws, key, std::move(t));
  }
  return changed;
}

// quantized: norms in fp32; every matrix stays in its GGUF blocks (repacked,
// not dequantized), but a MoE router (fp32 in the graph, as llama.cpp never
// quantizes it). Returns the number of matrices the pack fault changed.
size_t pack_quantized_matrices(const gguf::File& f, const ModelConfig& c, const ModelDims& D,
                               const PackFault& pf, WeightSet& ws) {
  size_t changed = 0;
  put_vectors(f, c, D, ws);
  ws.spec_template.layer_formats.resize(size_t(D.n_layer) * kLayerMatrices, MatrixFormat::F32);
  for (int32_t l = 0; l < D.n_layer; ++l) {
    for (int k = 0; k < kLayerMatrices; ++k) {
      const auto [in, out, count] = layer_matrix_shape(D, k);
      if (count == 0) continue;
      const MatrixSource src = matrix_source(c, D, l, k);
      const std::string key = "blk." + std::to_string(l) + "." + layer_matrix_name(D, k);
      const gguf::TensorInfo& ti = f.tensor(src.tensor);
      MatrixFormat& fmt = ws.spec_template.layer_formats[size_t(l * kLayerMatrices + k)];
      if (k == kFfnGateInp)
        put_tensor(ws, key, transpose_f32(gguf::dequantize(f, ti), out, in));
      else if (count > 1)
        changed += pack_stacked(f, ti, key, in, out, count, ws, fmt, pf, src.row0);
      else
        changed += pack_blocks(f, ti, key, in, out, ws, fmt, pf, src.row0);
    }
  }
  return changed;
}

// The embedding for the in-graph gather: Q8_0 rows as stored (qs [1][V][d],
// d [1][V][nb]; dequantized in the graph), any other type dequantized to fp32
// [1][V][d] at load (a row lookup, not a matmul).
void put_embedding(const gguf::File& f, const gguf::TensorInfo& embd, const ModelDims& D,
                   WeightSet& ws) {
  if (embd.type != TensorType::Q8_0) {
    std::vector<float> e = gguf::dequantize(f, embd);
    HostTensor t = HostTensor::make({1, D.n_vocab, D.n_embd}, "f32");
    std::memcpy(t.data.get(), e.data(), t.bytes);
    put_tensor(ws, "token_embd", std::move(t));
    ws.spec_template.embd_format = MatrixFormat::F32;
    return;
  }
  const int64_t nb = D.n_embd / 32;
  HostTensor rq = HostTensor::make({1, D.n_vocab, D.n_embd}, "i8"),
             rd = HostTensor::make({1, D.n_vocab, nb}, "f16");
  const auto raw = f.tensor_data(embd);
  for (int64_t v = 0; v < D.n_vocab; ++v) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = raw.data() + size_t(v * nb + b) * sizeof(gguf::block_q8_0);
      std::memcpy(&rd.as<uint16_t>()[v * nb + b], blk, 2);
      std::memcpy(&rq.as<uint8_t>()[v * D.n_embd + b * 32], blk + 2, 32);
    }
  }
  put_tensor(ws, "token_embd.rows.qs", rq);
  put_tensor(ws, "token_embd.rows.d", rd);
  ws.spec_template.embd_format = MatrixFormat::Q8_0;
}

std::unique_ptr<WeightSet> load_quantized(const gguf::File& f, const ModelConfig& c,
                                          const ModelDims& D, const PackFault& pf) {
  auto ws = std::make_unique<WeightSet>();
  ws->spec_template.mode = WeightMode::Quantized;
  const gguf::TensorInfo* out_w = f.find_tensor("output.weight");
  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  size_t changed = pack_quantized_matrices(f, c, D, pf, *ws);
  MatrixFormat head = MatrixFormat::F32;
  changed += pack_blocks(f, out_w ? *out_w : embd, "lm_head", D.n_embd, D.n_vocab, *ws, head, pf);
  ws->spec_template.head_format = head;
  if ((pf.swap_dm || pf.swap_nibbles) && changed == 0) {
    throw abi::StatusError(TS_ERR_UNSUPPORTED,
                           "static_graph: the quantized-only fault applies to no matrix of this "
                           "model (Q4_1 for quant_scale_min_swap, Q4_0/Q4_1 for nibble_order)");
  }
  put_embedding(f, embd, D, *ws);
  return ws;
}

}  // namespace

const WeightSet& GraphModel::weights(WeightMode mode, const touchstone::Faults& faults) {
  std::lock_guard<std::mutex> lock(mu);
  const bool faulty_pack = mode == WeightMode::Quantized && faults.quantized_only();
  std::unique_ptr<WeightSet>& slot = mode == WeightMode::FullPrecision ? full
                                     : faulty_pack                     ? faulty[faults.name]
                                                                       : quant;
  if (slot) return *slot;
  const gguf::File f = gguf::File::open(path);
  if (mode == WeightMode::FullPrecision) {
    slot = load_full_precision(f, config, dims);
  } else {
    const PackFault pf{faults.quant_scale_min_swap, faults.nibble_order};
    slot = load_quantized(f, config, dims, faulty_pack ? pf : PackFault{});
  }
  return *slot;
}

namespace {

// Refuses (TS_ERR_UNSUPPORTED, naming them) an architecture or features the
// graphs do not compute. (Block matrices, the quantized path, have whole
// 32-blocks by construction; fp32 ones any size.)
void check_supported(const ModelConfig& c, const std::string& path) {
  const std::string missing = touchstone::unsupported_features(c, kArchitectures, kModelFeatures);
  if (!missing.empty())
    throw abi::StatusError(TS_ERR_UNSUPPORTED,
                           path + ": not supported by static_graph: " + missing);
  if (c.n_rot % 2) throw abi::StatusError(TS_ERR_UNSUPPORTED, path + ": odd rope.dimension_count");
}

// The config as the graph sees it, and the distinct RoPE tables of its layers.
ModelDims dims_of(const ModelConfig& c, std::vector<RopeTable>& tables) {
  ModelDims d{c.n_layer,   c.n_embd,   c.n_ff,    c.n_head,
              c.n_head_kv, c.head_dim, c.n_vocab, c.rms_norm_eps};
  d.n_rot = c.n_rot;
  d.neox_rope = c.rope_style == RopeStyle::NeoX;
  d.qkv_bias = c.qkv_bias;
  d.qk_norm = c.qk_norm;
  d.post_norms = c.post_norms;
  d.geglu = c.ffn_activation == FfnActivation::GeluTanh;
  d.embd_scale = c.embd_scale;
  d.attn_scale = c.attn_scale;
  d.final_logit_softcap = c.final_logit_softcap;
  d.n_expert = c.moe.n_expert;
  d.n_expert_used = c.moe.n_expert_used;
  d.n_ff_exp = c.moe.n_ff_exp;
  d.n_ff_shexp = c.moe.n_ff_shexp;
  d.norm_topk = c.moe.norm_topk || c.moe.router == MoeRouter::TopKSoftmax;
  d.moe_biases = c.moe.biases;
  d.swiglu_oai = c.moe.activation == ExpertActivation::SwiGLUOai;
  d.attn_out_bias = c.attn_out_bias;
  d.attn_sinks = c.attn_sinks;
  tables.clear();
  for (const LayerConfig& lc : c.layers) {
    size_t k = 0;
    while (k < tables.size() &&
           (tables[k].base != lc.rope_base || tables[k].scale != lc.rope_scale))
      ++k;
    if (k == tables.size()) tables.push_back(RopeTable{lc.rope_base, lc.rope_scale});
    d.layer_rope.push_back(int32_t(k));
    d.layer_window.push_back(lc.sliding_window);
  }
  if (tables.empty()) tables.push_back(RopeTable{c.rope_freq_base, 1.0});
  d.n_rope_tables = int32_t(tables.size());
  return d;
}

}  // namespace

std::unique_ptr<GraphModel> load_model(const std::string& path) {
  auto m = std::make_unique<GraphModel>();
  m->path = path;
  const gguf::File f = gguf::File::open(path);
  m->config = read_model_config(f);
  check_supported(m->config, path);
  m->dims = dims_of(m->config, m->rope_tables);
  if (m->config.rope_freq_factors) {
    m->rope_freqs = gguf::dequantize(f, f.tensor("rope_freqs.weight"));
    if (m->rope_freqs.size() != size_t(m->config.n_rot / 2))
      throw abi::StatusError(TS_ERR_IO, path + ": rope_freqs.weight has the wrong size");
  }
  m->n_ctx_train = m->config.n_ctx_train;
  return m;
}

int32_t pick_window(int32_t needed, int32_t capacity, const BucketConfig& b) {
  for (int32_t w : b.windows)
    if (w >= needed && w < capacity) return w;
  return capacity;
}

std::vector<Chunk> plan_prefill(int32_t pos, int32_t n, int32_t capacity, const BucketConfig& b) {
  std::vector<Chunk> out;
  int32_t done = 0;
  const int32_t largest = b.prefill.empty() ? 1 : b.prefill.back();
  while (done < n) {
    const int32_t left = n - done, p = pos + done;
    int32_t T = 1;
    if (left > 1) {
      // Smallest bucket holding what is left; else the largest bucket (chunking).
      T = largest;
      for (int32_t bk : b.prefill) {
        if (bk >= left) {
          T = bk;
          break;
        }
      }
      // The padded rows are written to the KV cache too: they must fit.
      while (T > 1 && p + T > capacity) {
        int32_t smaller = 1;
        for (int32_t bk : b.prefill)
          if (bk < T) smaller = bk;
        T = smaller;
      }
    }
    const int32_t take = std::min(T, left);
    out.push_back(Chunk{done, take, T, pick_window(p + T, capacity, b)});
    done += take;
  }
  return out;
}

std::string default_cache_dir() {
  if (const char* e = std::getenv("TOUCHSTONE_STATIC_GRAPH_CACHE")) return e;  // "" disables
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/touchstone/static_graph";
}

GraphSession::GraphSession(GraphModel& m, WeightMode mode, int32_t capacity, int n_threads,
                           const touchstone::Faults& faults)
    : m_(m),
      mode_(mode),
      w_(m.weights(mode, faults)),
      cap_(capacity),
      n_threads_(n_threads > 0 ? n_threads
                               : int(std::max(1u, std::thread::hardware_concurrency()))),
      faults_(faults) {
  const ModelDims& D = m.dims;
  const int64_t L = D.n_layer, KVH = D.n_head_kv, hd = D.head_dim, rot = D.rot(), half = rot / 2;
  kc_ = HostTensor::make({1, L * KVH * hd * cap_, 1}, "f32");
  vc_ = HostTensor::make({1, L * KVH * cap_, hd}, "f32");
  for (const RopeTable& rt : m.rope_tables) {
    HostTensor c = HostTensor::make({1, cap_, half}, "f32"),
               s = HostTensor::make({1, cap_, half}, "f32");
    // rope_base_off_1pct fault: the tables are built with every base * 1.01.
    const double base = rt.base * faults_.rope_base_scale;
    const bool yarn = m.config.rope_yarn.factor > 0;
    const ops::YarnFrequencies fr =
        yarn ? ops::yarn_frequencies(m.config.rope_yarn, rot, base) : ops::YarnFrequencies{};
    for (int64_t p = 0; p < cap_; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        // The reference's angle (ops::rope_theta, or YaRN's frequencies and cos/sin
        // scale: ops::rope_with_frequencies; fp64), cos/sin rounded once to fp32.
        const double ff = m.rope_freqs.empty() ? 1.0 : double(m.rope_freqs[size_t(i)]);
        const double theta = yarn ? double(p) * fr.inv_freq[size_t(i)]
                                  : ops::rope_theta(int32_t(p), i, rot, base, rt.scale, ff);
        c.as<float>()[p * half + i] = static_cast<float>(std::cos(theta) * fr.mscale);
        s.as<float>()[p * half + i] = static_cast<float>(std::sin(theta) * fr.mscale);
      }
    }
    rcos_.push_back(std::move(c));
    rsin_.push_back(std::move(s));
  }
}

namespace {
bool is_cache(const std::string& n) {
  return n.rfind("k_cache.", 0) == 0 || n.rfind("v_cache.", 0) == 0;
}
int64_t cache_layer(const std::string& n) { return std::stoll(n.substr(8)); }
// rope_cos / rope_sin -> 0, rope_cos.<k> -> k.
size_t rope_table_of(const std::string& n) {
  return n.size() > 9 ? size_t(std::stoul(n.substr(9))) : 0;
}
}  // namespace

// The faults that live in the graph (the others are host-side: RoPE tables,
// logits, weight packing, rewind). thread_order_reduction: one input-dim slice
// per thread of this session, so the graph (and its logits) depend on n_threads.
GraphFaults GraphSession::graph_faults() const {
  const touchstone::Faults& f = faults_;
  GraphFaults g;
  g.rope_layout = f.rope_layout;
  g.kv_off_by_one = f.kv_off_by_one;
  g.kv_write_next = f.kv_write_next;
  g.gqa_mapping = f.gqa_mapping;
  g.attention_scale = f.attention_scale;
  g.softmax_no_max = f.softmax_no_max;
  g.rms_eps_scale = f.rms_eps_scale;
  g.fp16_accumulation = f.fp16_accumulation;
  g.causal_mask = f.causal_mask;
  g.last_layer_skipped = f.last_layer_skipped;
  g.kv_len_input = f.rewind_noop;
  // The MoE faults as the reference's faulty_route (reference_ffn.cpp): a family that
  // renormalises (norm_topk, or gpt-oss's softmax over the top k) does not with
  // moe_renorm_skipped; moe_softmax_order makes a softmax-top-k family that does not
  // renormalise do so, and gpt-oss take its softmax over every expert.
  const MoeConfig& moe = m_.config.moe;
  g.moe_runner_up = f.moe_runner_up;
  if (f.moe_softmax_order && !moe.norm_topk)
    g.moe_renormalise = moe.router == MoeRouter::SoftmaxTopK ? 1 : 0;
  else if (f.moe_renorm_skipped)
    g.moe_renormalise = 0;
  g.moe_shared_expert_dropped = f.moe_shared_expert_dropped;
  g.attention_sinks_ignored = f.attention_sinks_ignored;
  if (f.session_order_reduction && session_slices_ == 0) {
    // The fault, decided when the session builds its first graph: the first
    // session of the process to run plain matmuls, every later one a 2-slice
    // split, as an autotuner that switches after its first run would (two
    // graph variants keep the compile cost bounded).
    static std::atomic<bool> first{true};
    session_slices_ = first.exchange(false) ? 1 : 2;
  }
  g.reduction_slices = f.thread_order_reduction    ? n_threads_
                       : f.session_order_reduction ? session_slices_
                                                   : 1;
  return g;
}

GraphSession::Graph& GraphSession::graph(int32_t T, int32_t W, bool argmax, Input input) {
  auto it = graphs_.find({T, W, argmax, input});
  if (it != graphs_.end()) return it->second;
  GraphSpec spec = w_.spec_template;
  spec.T = T;
  spec.W = W;
  spec.capacity = cap_;
  spec.argmax = argmax;
  spec.embeddings = input != Input::Tokens;
  spec.block = input == Input::Block;
  spec.faults = graph_faults();
  // One thread: the sequential pipeline (no strips, no OpenMP region). The
  // strips cost the fp32 decode matmuls (fallback schedule) ~40% on one
  // thread; both pipelines give bitwise the same results.
  const bool parallel = n_threads_ > 1 && !openmp_runtime().empty();
  const std::string name = "step";
  Graph g;
  g.built = build_step_graph(m_.dims, spec, name);
  // A graph-side fault makes other graphs (other text, other cache key); the
  // packing faults make other weights for the same graphs.
  const std::string fault_key = spec.faults.any() ? "_fault_" + faults_.name + "_x" +
                                                        std::to_string(spec.faults.reduction_slices)
                                                  : "";
  const std::string key = (mode_ == WeightMode::FullPrecision ? "f" : "q") + std::to_string(T) +
                          "_" + std::to_string(W) + "_" + std::to_string(cap_) +
                          (argmax ? "_argmax" : "") +
                          (input == Input::Embeddings ? "_embd"
                           : input == Input::Block    ? "_block"
                                                      : "") +
                          (parallel ? "_par" : "") + fault_key;
  {
    std::lock_guard<std::mutex> lock(m_.mu);
    auto git = m_.graphs.find(key);
    if (git != m_.graphs.end()) g.compiled = git->second;
  }
  if (!g.compiled) {
    CompileOptions opt;
    opt.cache_dir = default_cache_dir();
    opt.parallel = parallel;
    g.compiled = compile_graph(g.built.mlir, name, opt);
    std::lock_guard<std::mutex> lock(m_.mu);
    m_.graphs[key] = g.compiled;
    stats_.push_back(GraphStats{key, g.compiled->compile_seconds, g.compiled->from_cache});
    if (const char* v = std::getenv("TOUCHSTONE_STATIC_GRAPH_VERBOSE"); v && *v) {
      std::fprintf(stderr, "static_graph: graph %s (T=%d, W=%d, capacity %d): %s in %.2f s\n",
                   key.c_str(), T, W, cap_,
                   g.compiled->from_cache ? "loaded from cache" : "compiled",
                   g.compiled->compile_seconds);
    }
  }
  int n_cache_results = 0;
  for (const ArgInfo& r : g.built.results) n_cache_results += is_cache(r.name);
  const int expected = int(g.built.args.size() + g.built.results.size()) - n_cache_results;
  if (g.compiled->lowered_num_args != expected) {
    throw std::runtime_error(
        "static_graph: lowered signature has " + std::to_string(g.compiled->lowered_num_args) +
        " arguments, expected " + std::to_string(expected) + " (KV caches not updated in place?)");
  }
  return graphs_.emplace(std::make_tuple(T, W, argmax, input), std::move(g)).first->second;
}

namespace {
// A ranked memref descriptor: {alloc, aligned, offset, sizes[r], strides[r]}.
struct Desc {
  std::vector<int64_t> words;
  void set(void* p, const std::vector<int64_t>& shape) {
    const size_t r = shape.size();
    words.assign(3 + 2 * r, 0);
    words[0] = reinterpret_cast<int64_t>(p);
    words[1] = reinterpret_cast<int64_t>(p);
    words[2] = 0;
    int64_t stride = 1;
    for (size_t i = r; i-- > 0;) {
      words[3 + i] = shape[i];
      words[3 + r + i] = stride;
      stride *= shape[i];
    }
  }
};
}  // namespace

void GraphSession::run(const Chunk& c, const int32_t* tokens, float* logits_rows, int32_t* greedy,
                       const float* embd, bool block) {
  const Input input = !embd ? Input::Tokens : block ? Input::Block : Input::Embeddings;
  Graph& g = graph(c.T, c.W, greedy != nullptr, input);
  const int64_t V = m_.dims.n_vocab;
  const size_t d = size_t(m_.dims.n_embd);
  std::vector<int32_t> tok(embd ? 0 : size_t(c.T), 0);
  std::vector<float> rows(embd ? size_t(c.T) * d : 0, 0.0f);  // padding rows: zeros
  if (embd)
    std::copy(embd + size_t(c.start) * d, embd + size_t(c.start + c.n) * d, rows.begin());
  else
    std::copy(tokens + c.start, tokens + c.start + c.n, tok.begin());
  int32_t pos = pos_, kv_len = kv_len_, tap_row = c.n - 1;
  out_.resize(size_t(c.T * V));
  taps_out_.resize(size_t(m_.dims.n_layer) * 3 * size_t(m_.dims.n_embd));
  std::vector<int32_t> am(size_t(c.T));
  size_t n_args = g.built.args.size();
  for (const ArgInfo& r : g.built.results) n_args += !is_cache(r.name);
  const int64_t kc_layer =
      int64_t(m_.dims.n_head_kv) * m_.dims.head_dim * cap_;  // floats per layer (K and V)
  std::vector<Desc> descs(n_args);
  std::vector<void*> desc_ptrs(n_args), args(n_args);
  size_t i = 0;
  for (const ArgInfo& a : g.built.args) {
    void* p = nullptr;
    if (a.name == "tokens")
      p = tok.data();
    else if (a.name == "embd")
      p = rows.data();
    else if (a.name == "pos")
      p = &pos;
    else if (a.name == "kv_len")  // rewind_noop fault only
      p = &kv_len;
    else if (a.name == "tap_row")
      p = &tap_row;
    else if (a.name.rfind("rope_cos", 0) == 0)
      p = (rope_origin_ > 0 ? shifted_cos_ : rcos_).at(rope_table_of(a.name)).data.get();
    else if (a.name.rfind("rope_sin", 0) == 0)
      p = (rope_origin_ > 0 ? shifted_sin_ : rsin_).at(rope_table_of(a.name)).data.get();
    else if (a.name.rfind("k_cache.", 0) == 0)
      p = kc_.as<float>() + cache_layer(a.name) * kc_layer;
    else if (a.name.rfind("v_cache.", 0) == 0)
      p = vc_.as<float>() + cache_layer(a.name) * kc_layer;
    else {
      auto it = w_.tensors.find(a.name);
      if (it == w_.tensors.end())
        throw std::logic_error("static_graph: no tensor for argument " + a.name);
      p = it->second.data.get();
    }
    descs[i++].set(p, a.shape);
  }
  for (size_t r = 0; r < g.built.results.size(); ++r) {
    const ArgInfo& a = g.built.results[r];
    if (is_cache(a.name)) continue;
    void* p = a.name == "logits" ? static_cast<void*>(out_.data())
              : a.name == "taps" ? static_cast<void*>(taps_out_.data())
                                 : static_cast<void*>(am.data());
    descs[i++].set(p, a.shape);
  }
  for (size_t k = 0; k < n_args; ++k) {
    desc_ptrs[k] = descs[k].words.data();
    args[k] = &desc_ptrs[k];
  }
  set_num_threads(n_threads_);  // the matmuls' OpenMP strips
  g.compiled->call(args.data());
  if (taps_on_) taps_ = taps_out_;
  if (faults_.logit_noise != 0.0) perturb_logits(c.n);
  if (logits_rows) std::memcpy(logits_rows, out_.data(), size_t(c.n) * size_t(V) * sizeof(float));
  if (greedy) {
    const int32_t t = am[size_t(c.n - 1)];
    const float* row = out_.data() + int64_t(c.n - 1) * V;
    // tosa.argmax (nan_mode IGNORE) starts from (index 0, -FLT_MAX) and takes
    // strictly greater values: it answers 0 when no logit exceeds -FLT_MAX
    // (every logit NaN, -inf or -FLT_MAX). Only then is the row scanned here,
    // with the contract's rule (and an error when every logit is NaN).
    // (logits_perturb_1e-3 fault: the host changed the logits after the graph's
    // argmax, so the row is scanned again: the token follows the returned logits.)
    const bool degenerate = t < 0 || t >= V || !(row[t] > -std::numeric_limits<float>::max());
    *greedy = degenerate || faults_.logit_noise != 0.0 ? abi::greedy_argmax(row, V) : t;
  }
  pos_ += c.n;
  kv_len_ = std::max(kv_len_, pos_);
}

// logits_perturb_1e-3 fault (host-side post-processing of the graph's output):
// the logit i of position p times (1 +/- 1e-3), sign fault_noise_sign(p * V + i), as
// the reference does.
void GraphSession::perturb_logits(int32_t n_rows) {
  const int64_t V = m_.dims.n_vocab;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint64_t base = uint64_t(pos_ + r) * uint64_t(V);
    float* row = out_.data() + r * V;
    for (int64_t i = 0; i < V; ++i) {
      row[i] = static_cast<float>(
          double{row[i]} *
          (1.0 + faults_.logit_noise * touchstone::fault_noise_sign(base + uint64_t(i))));
    }
  }
}

// prefill_position_reset fault: tables whose row p holds position p - origin
// (rows below origin are never read by this call: its positions start there).
void GraphSession::shift_rope_tables(int32_t origin) {
  rope_origin_ = origin;
  if (origin <= 0) return;
  const int64_t half = m_.dims.rot() / 2;
  for (size_t k = shifted_cos_.size(); k < rcos_.size(); ++k) {
    shifted_cos_.push_back(HostTensor::make({1, cap_, half}, "f32"));
    shifted_sin_.push_back(HostTensor::make({1, cap_, half}, "f32"));
  }
  const size_t rows = size_t(cap_ - origin), n = rows * size_t(half);
  for (size_t k = 0; k < rcos_.size(); ++k) {
    std::memcpy(shifted_cos_[k].as<float>() + origin * half, rcos_[k].as<float>(),
                n * sizeof(float));
    std::memcpy(shifted_sin_[k].as<float>() + origin * half, rsin_[k].as<float>(),
                n * sizeof(float));
  }
}

void GraphSession::prefill(const int32_t* tokens, int32_t n, bool all_positions, float* logits) {
  const int64_t V = m_.dims.n_vocab;
  shift_rope_tables(faults_.prefill_position_reset && n > 1 ? pos_ : 0);
  run_chunks(plan_prefill(pos_, n, cap_, buckets), n, tokens, nullptr, false, all_positions,
             logits);
  shift_rope_tables(0);
  if (faults_.logits_row_shift && all_positions && n > 1)  // the fault: row i holds row i-1
    std::memmove(logits + V, logits, size_t(n - 1) * size_t(V) * sizeof(float));
}

void GraphSession::prefill_embeddings(const float* embd, int32_t n, bool bidirectional,
                                      bool all_positions, float* logits) {
  // image_attended_causally fault: the block attended causally, as text.
  const bool block = bidirectional && !faults_.image_attended_causally;
  const std::vector<Chunk> plan =
      block ? std::vector<Chunk>{{0, n, n, pick_window(pos_ + n, cap_, buckets)}}
            : plan_prefill(pos_, n, cap_, buckets);
  run_chunks(plan, n, nullptr, embd, block, all_positions, logits);
}

void GraphSession::run_chunks(const std::vector<Chunk>& plan, int32_t n, const int32_t* tokens,
                              const float* embd, bool block, bool all_positions, float* logits) {
  const int64_t V = m_.dims.n_vocab;
  for (const Chunk& c : plan) {
    if (all_positions) {
      run(c, tokens, logits + int64_t(c.start) * V, nullptr, embd, block);
    } else {
      run(c, tokens, nullptr, nullptr, embd, block);
      if (c.start + c.n == n)
        std::memcpy(logits, out_.data() + int64_t(c.n - 1) * V, size_t(V) * sizeof(float));
    }
  }
}

int32_t GraphSession::prefill_greedy(const int32_t* tokens, int32_t n) {
  // Same plan as prefill; only the last chunk needs the argmax variant.
  int32_t token = -1;
  shift_rope_tables(faults_.prefill_position_reset && n > 1 ? pos_ : 0);
  for (const Chunk& c : plan_prefill(pos_, n, cap_, buckets))
    run(c, tokens, nullptr, c.start + c.n == n ? &token : nullptr);
  shift_rope_tables(0);
  return token;
}

void GraphSession::decode(int32_t token, float* logits) {
  Chunk c{0, 1, 1, pick_window(pos_ + 1, cap_, buckets)};
  run(c, &token, logits);
}

void GraphSession::rewind(int32_t p) {
  pos_ = p;
  // The graph's causal mask hides every key past pos + t, so nothing else is
  // needed; the rewind_noop fault's graphs also show the keys below kv_len,
  // which this (faulty) rewind then leaves where it was.
  if (!faults_.rewind_noop) kv_len_ = p;
}

}  // namespace touchstone::static_graph
