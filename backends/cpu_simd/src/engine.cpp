// engine.cpp - the cpu_simd model views (GGUF blocks or fp32 copies), the
// session's setup (KV cache, scratch, fault copies) and the matmul dispatch
// (linears). The forward pass itself: engine_pass.cpp (layers),
// engine_attention.cpp, engine_moe.cpp (mixture-of-experts FFN), engine_batch.cpp
// (prefill / decode / step_batch / fork).
//
// Numerics (see docs/backends/cpu_simd.md):
//  * matrices: full precision = fp32 weights, fp32 accumulation (OpenBLAS sgemm
//    for several tokens, the Highway matvec for one); quantized = GGUF blocks x
//    fp32 activations (or opt-in int8 activations, kernels_quant.cpp), the
//    same bits for any token count (F32 matrices there: the matvec per token).
//  * RMSNorm sums (also QK-norm and post-norms), RoPE angles and rotation,
//    SiLU / GELU, embedding scale, soft-capping: fp64 like the reference,
//    rounded once to fp32.
//  * attention: fp32 scores (SIMD dot), fp32 softmax (max-subtracted vector
//    exp, lane-wise sum), fp32 weighted sum of V (kernels.h: attend_f32); KV
//    cache in fp32.
#include "engine.h"

#include <sys/mman.h>

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "engine_ops.h"
#include "touchstone/abi/backend_impl.h"
#include "touchstone/common/error.h"
#include "touchstone/model/quant.h"
#include "touchstone/model/scalar_ops.h"

namespace touchstone::cpu_simd {

using touchstone::abi::StatusError;
namespace gg = touchstone::gguf;

namespace {

bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e && std::strcmp(e, value) == 0;
}

// A matrix [n_out][n_in] of the file (ggml shape {n_in, n_out}), or, with
// n_expert > 0, a 3-D expert tensor {n_in, n_out, n_expert} viewed as one matrix of
// n_expert * n_out rows (expert e: rows [e * n_out, (e + 1) * n_out)).
Linear make_quant(const gg::File& f, const std::string& name, size_t n_in, size_t n_out,
                  std::string* why, size_t n_expert = 0) {
  Linear L;
  L.n_in = n_in;
  L.n_out = n_expert ? n_out * n_expert : n_out;
  const gg::TensorInfo& t = f.tensor(name);
  const bool shape_ok =
      n_expert ? t.shape.size() == 3 && t.shape[2] == n_expert : t.shape.size() == 2;
  if (!shape_ok || t.shape[0] != n_in || t.shape[1] != n_out) {
    throw StatusError(TS_ERR_IO, f.path() + ": tensor " + name + " has an unexpected shape");
  }
  switch (t.type) {
    case gg::TensorType::Q4_0:
      L.qtype = QType::Q4_0;
      break;
    case gg::TensorType::Q4_1:
      L.qtype = QType::Q4_1;
      break;
    case gg::TensorType::Q8_0:
      L.qtype = QType::Q8_0;
      break;
    case gg::TensorType::F32: {
      // Stored fp32: used in place by the fp32 kernels (tiny test models; real
      // models keep only vectors in F32).
      const uint8_t* p = f.tensor_data(t).data();
      if (reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
        L.f = reinterpret_cast<const float*>(p);
        return L;
      }
      [[fallthrough]];
    }
    default: {
      // Generic block kernel: dequantize each block in the kernel (the
      // reference's bit-exact routine) and multiply with fp32 activations.
      const gg::TypeTraits* tr = gg::find_type_traits(t.type);
      if (!tr || !gg::can_dequantize(t.type)) {
        if (why->empty()) {
          *why = "quantized path: tensor " + name + " has type " +
                 std::string(gg::type_name(t.type)) + ", which has no kernel";
        }
        return L;
      }
      L.generic = true;
      L.gtype = int(t.type);
      // Plain types (F16, BF16, F32: block size 1) run in chunks of 32 elements.
      L.block_elems = tr->block_size >= 32 ? tr->block_size : 32;
      L.block_bytes = L.block_elems / tr->block_size * tr->type_size;
      if (n_in % L.block_elems != 0) {
        if (why->empty()) {
          *why = "quantized path: tensor " + name + " row length " + std::to_string(n_in) +
                 " is not a multiple of its block size " + std::to_string(L.block_elems);
        }
        return L;
      }
      L.row_bytes = n_in / L.block_elems * L.block_bytes;
      L.q = f.tensor_data(t).data();
      return L;
    }
  }
  if (n_in % 32 != 0) {
    if (why->empty())
      *why = "quantized path: tensor " + name + " row length is not a multiple of 32";
    return L;
  }
  L.row_bytes = n_in / 32 * qtype_block_bytes(L.qtype);
  L.block_bytes = qtype_block_bytes(L.qtype);
  L.q = f.tensor_data(t).data();
  return L;
}

Linear make_fp(const std::vector<float>& w, size_t n_in, size_t n_out) {
  Linear L;
  L.f = w.data();
  L.n_in = n_in;
  L.n_out = n_out;
  return L;
}

}  // namespace

// ------------------------------------------------------------------ SimdModel
namespace {

// Refuses (UnsupportedModel, naming them) an architecture or features this
// engine does not compute; read_model_config has already refused what no
// backend of this repository computes.
void check_supported(const touchstone::ModelConfig& c, const std::string& path) {
  const std::string missing = touchstone::unsupported_features(c, kArchitectures, kModelFeatures);
  if (!missing.empty())
    throw touchstone::UnsupportedModel("{}: not supported by cpu_simd: {}", path, missing);
}

// Rows [r0, r0 + n) of a matrix view (GGUF blocks or fp32): a fused tensor's part.
Linear rows_of(const Linear& m, size_t r0, size_t n) {
  Linear L = m;
  L.n_out = n;
  if (m.q) L.q = m.q + r0 * m.row_bytes;
  if (m.f) L.f = m.f + r0 * m.n_in;
  return L;
}

// The n_expert matrices of n_out rows each of a 3-D expert tensor (make_quant).
std::vector<Linear> experts_of(const Linear& all, size_t n_expert) {
  std::vector<Linear> v;
  const size_t n_out = all.n_out / n_expert;
  for (size_t e = 0; e < n_expert; ++e) v.push_back(rows_of(all, e * n_out, n_out));
  return v;
}

// A mixture-of-experts layer's router and experts (llama.cpp llama-model.cpp,
// LLM_ARCH_LLAMA / LLM_ARCH_QWEN3MOE): ffn_gate_inp {n_embd, n_expert},
// ffn_{gate,up}_exps {n_embd, n_ff_exp, n_expert}, ffn_down_exps {n_ff_exp, n_embd,
// n_expert}; expert e is rows [e * n_out, (e + 1) * n_out) of its tensor.
// gpt-oss (LLM_ARCH_OPENAI_MOE) adds ffn_gate_inp.bias {n_expert} and
// ffn_{gate,up}_exps.bias {n_ff_exp, n_expert}, ffn_down_exps.bias {n_embd, n_expert}
// (vec: fp32 copies).
template <class Vec>
void moe_views(const gg::File& f, const touchstone::ModelConfig& c, const std::string& b,
               LayerView& L, std::string* why, Vec&& vec) {
  const size_t d = size_t(c.n_embd), ne = size_t(c.moe.n_expert), fe = size_t(c.moe.n_ff_exp);
  L.router = make_quant(f, b + "ffn_gate_inp.weight", d, ne, why);
  auto exps = [&](const char* name, size_t n_in, size_t n_out) {
    return experts_of(make_quant(f, b + name, n_in, n_out, why, ne), ne);
  };
  L.gate_exps = exps("ffn_gate_exps.weight", d, fe);
  L.up_exps = exps("ffn_up_exps.weight", d, fe);
  L.down_exps = exps("ffn_down_exps.weight", fe, d);
  if (c.moe.biases) {
    L.router_b = vec(b + "ffn_gate_inp.bias", ne);
    L.gate_exps_b = vec(b + "ffn_gate_exps.bias", ne * fe);
    L.up_exps_b = vec(b + "ffn_up_exps.bias", ne * fe);
    L.down_exps_b = vec(b + "ffn_down_exps.bias", ne * d);
  }
  if (c.moe.n_ff_shexp > 0) {  // qwen2moe
    const size_t fs = size_t(c.moe.n_ff_shexp);
    L.shexp_gate = vec(b + "ffn_gate_inp_shexp.weight", d);
    L.gate_shexp = make_quant(f, b + "ffn_gate_shexp.weight", d, fs, why);
    L.up_shexp = make_quant(f, b + "ffn_up_shexp.weight", d, fs, why);
    L.down_shexp = make_quant(f, b + "ffn_down_shexp.weight", fs, d, why);
  }
}

}  // namespace

std::vector<Linear*> LayerView::matrices() {
  std::vector<Linear*> v = {&wq,   &wk,     &wv,         &wo,       &gate,      &up,
                            &down, &router, &gate_shexp, &up_shexp, &down_shexp};
  for (std::vector<Linear>* x : {&gate_exps, &up_exps, &down_exps})
    for (Linear& w : *x) v.push_back(&w);
  return v;
}

SimdModel::SimdModel(const std::string& path) : path_(path), file_(gg::File::open(path)) {
  cfg_ = touchstone::read_model_config(file_);
  check_supported(cfg_, path);
  const size_t d = size_t(cfg_.n_embd), hd = size_t(cfg_.head_dim), ff = size_t(cfg_.n_ff);
  const size_t qd = size_t(cfg_.n_head) * hd, kvd = size_t(cfg_.n_head_kv) * hd;
  embd_ = &file_.tensor("token_embd.weight");
  auto vec = [&](const std::string& name, size_t n) {
    const gg::TensorInfo& t = file_.tensor(name);
    if (t.n_elements != n) throw StatusError(TS_ERR_IO, path + ": " + name + " has the wrong size");
    norms_.push_back(gg::dequantize(file_, t));
    return norms_.back().data();
  };
  auto mat = [&](const std::string& name, size_t n_in, size_t n_out) {
    return make_quant(file_, name, n_in, n_out, &q_unsupported_);
  };
  norms_.reserve(size_t(cfg_.n_layer) * 15 + 1);
  for (int32_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerView L;
    L.attn_norm = vec(b + "attn_norm.weight", d);
    L.ffn_norm = vec(b + touchstone::ffn_norm_tensor(cfg_), d);
    if (cfg_.fused_qkv) {
      const Linear qkv = mat(b + "attn_qkv.weight", d, qd + 2 * kvd);
      L.wq = rows_of(qkv, 0, qd);
      L.wk = rows_of(qkv, qd, kvd);
      L.wv = rows_of(qkv, qd + kvd, kvd);
    } else {
      L.wq = mat(b + "attn_q.weight", d, qd);
      L.wk = mat(b + "attn_k.weight", d, kvd);
      L.wv = mat(b + "attn_v.weight", d, kvd);
    }
    if (cfg_.qkv_bias) {
      L.bq = vec(b + "attn_q.bias", qd);
      L.bk = vec(b + "attn_k.bias", kvd);
      L.bv = vec(b + "attn_v.bias", kvd);
    }
    if (cfg_.qk_norm) {
      L.q_norm = vec(b + "attn_q_norm.weight", hd);
      L.k_norm = vec(b + "attn_k_norm.weight", hd);
    }
    L.wo = mat(b + "attn_output.weight", qd, d);
    if (cfg_.attn_out_bias) L.bo = vec(b + "attn_output.bias", d);
    if (cfg_.attn_sinks) L.sinks = vec(b + "attn_sinks.weight", size_t(cfg_.n_head));
    if (cfg_.is_moe()) {
      moe_views(file_, cfg_, b, L, &q_unsupported_, vec);
    } else if (cfg_.fused_gate_up) {
      const Linear gu = mat(b + "ffn_up.weight", d, 2 * ff);
      L.gate = rows_of(gu, 0, ff);
      L.up = rows_of(gu, ff, ff);
    } else {
      L.gate = mat(b + "ffn_gate.weight", d, ff);
      L.up = mat(b + "ffn_up.weight", d, ff);
    }
    if (!cfg_.is_moe()) L.down = mat(b + "ffn_down.weight", ff, d);
    if (cfg_.post_norms) {
      L.post_attn_norm = vec(b + "post_attention_norm.weight", d);
      L.post_ffn_norm = vec(b + "post_ffw_norm.weight", d);
    }
    q_.layers.push_back(L);
  }
  q_.output_norm = vec("output_norm.weight", d);
  q_.lm_head =
      mat(cfg_.tied_embeddings ? "token_embd.weight" : "output.weight", d, size_t(cfg_.n_vocab));
  if (cfg_.rope_freq_factors) {
    const gg::TensorInfo& t = file_.tensor("rope_freqs.weight");
    if (t.n_elements != size_t(cfg_.n_rot / 2)) {
      throw StatusError(TS_ERR_IO, path + ": rope_freqs.weight has the wrong size");
    }
    rope_freqs_ = gg::dequantize(file_, t);
  }
  if (!gg::can_dequantize(embd_->type)) {
    throw StatusError(TS_ERR_UNSUPPORTED, "token_embd.weight type cannot be dequantized");
  }
  if (q_unsupported_.empty()) {
    const char* e = std::getenv("TOUCHSTONE_CPU_SIMD_ARENA");
    if (!e || std::string(e) != "0") {
      relocate_quantized();
      release_file();
    }
  }
}

// Whether release_file() will free the file's copy: every matrix is quantized (an F32
// one is read in place from it).
bool SimdModel::file_releasable() {
  for (LayerView& L : q_.layers)
    for (const Linear* w : L.matrices())
      if (w->f != nullptr) return false;
  return q_.lm_head.f == nullptr;
}

// Once every matrix is in the arena (none read in place: an F32 matrix would be), the
// file's copy is dead weight but for the embedding rows: copy those, free the rest
// (resident memory about the file's size, not twice it).
void SimdModel::release_file() {
  if (!arena_ || !file_releasable()) return;
  const std::span<const uint8_t> e = file_.tensor_data(*embd_);
  embd_bytes_.assign(e.begin(), e.end());
  file_.release_data();
}

void SimdModel::ArenaFree::operator()(uint8_t* p) const { std::free(p); }

// Decode streams every matrix once per token. Served from the model buffer the
// weights sit in 4 KiB pages: a TLB miss every 4 KiB and the
// hardware prefetchers restart at every page. One anonymous arena with
// MADV_HUGEPAGE (2 MiB pages where the kernel grants them), in the order the
// forward pass reads the matrices, removes both. The bytes are unchanged.
void SimdModel::relocate_quantized() {
  constexpr size_t kAlign = size_t{2} << 20;
  std::vector<Linear*> all;
  for (LayerView& L : q_.layers) {
    for (Linear* w : L.matrices()) {
      if (w->q) all.push_back(w);  // (F32 matrices are used in place)
    }
  }
  if (q_.lm_head.q) all.push_back(&q_.lm_head);
  size_t total = 0;
  for (const Linear* w : all) total += (w->row_bytes * w->n_out + 63) & ~size_t{63};
  total = (total + kAlign - 1) & ~(kAlign - 1);
  uint8_t* base = static_cast<uint8_t*>(std::aligned_alloc(kAlign, total));
  if (!base) return;  // keep serving from the mapping
  arena_.reset(base);
  madvise(base, total, MADV_HUGEPAGE);
  // gguf::File holds the model in private memory (read, not mmap()ed, so truncating the
  // file cannot SIGBUS us). When release_file() will free that copy, each matrix's
  // source pages are given back as soon as it is copied (gguf::File::discard_pages), so
  // the load holds about one copy of the weights, not two; not a source that another
  // matrix still reads (overlapping ranges) nor the token embedding (its rows are
  // copied out by release_file()).
  const std::vector<bool> discard = discardable_sources(all);
  size_t off = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    Linear* w = all[i];
    const size_t n = w->row_bytes * w->n_out;
    std::memcpy(base + off, w->q, n);
    if (discard[i]) file_.discard_pages({w->q, n});
    w->q = base + off;
    off += (n + 63) & ~size_t{63};
  }
}

// discard[i]: matrix i's source bytes may be given back once copied (see
// relocate_quantized): the file will be released, no other matrix's source overlaps
// them, and they do not overlap the token embedding's bytes.
std::vector<bool> SimdModel::discardable_sources(const std::vector<Linear*>& all) {
  std::vector<bool> ok(all.size(), file_releasable());
  if (!ok.empty() && !ok[0]) return ok;
  const std::span<const uint8_t> e = file_.tensor_data(*embd_);
  std::vector<size_t> order(all.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto lo = [&](size_t i) { return reinterpret_cast<uintptr_t>(all[i]->q); };
  auto hi = [&](size_t i) { return lo(i) + all[i]->row_bytes * all[i]->n_out; };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lo(a) < lo(b); });
  const uintptr_t e_lo = reinterpret_cast<uintptr_t>(e.data()), e_hi = e_lo + e.size();
  // Runs of ranges that overlap one another (in start order, a range overlaps the run
  // while it starts before the run's furthest end): none of a run's is given back.
  for (size_t j = 0; j < order.size();) {
    size_t k = j + 1;
    uintptr_t end = hi(order[j]);
    for (; k < order.size() && lo(order[k]) < end; ++k) end = std::max(end, hi(order[k]));
    for (size_t x = j; x < k; ++x) {
      const size_t i = order[x];
      if (k - j > 1 || (lo(i) < e_hi && e_lo < hi(i))) ok[i] = false;
    }
    j = k;
  }
  return ok;
}

const WeightSet& SimdModel::quantized() const {
  if (!q_unsupported_.empty()) throw StatusError(TS_ERR_UNSUPPORTED, q_unsupported_);
  return q_;
}

// The model file read again (release_file freed the first copy), refused when it is not
// the file this model was loaded from (its size or any tensor's place or type changed).
gg::File SimdModel::reopened() const {
  gg::File f = gg::File::open(path_);
  bool same = f.file_size() == file_.file_size() && f.data_offset() == file_.data_offset() &&
              f.tensors().size() == file_.tensors().size();
  for (size_t i = 0; same && i < f.tensors().size(); ++i) {
    const gg::TensorInfo &a = f.tensors()[i], &b = file_.tensors()[i];
    same = a.name == b.name && a.type == b.type && a.offset == b.offset && a.shape == b.shape;
  }
  if (!same) {
    throw StatusError(TS_ERR_IO, path_ +
                                     ": changed since the model was loaded (its full-precision "
                                     "weights are read from the file on first use)");
  }
  return f;
}

const WeightSet& SimdModel::full_precision() {
  std::call_once(fp_once_, [&] {
    // The reference's loader: every tensor dequantized to fp32, fused Phi-3
    // matrices split, optional vectors empty when unused.
    fp_ = std::make_unique<touchstone::ModelWeights>(
        file_.metadata_only() ? touchstone::load_model_weights(reopened())
                              : touchstone::load_model_weights(file_));
    const size_t d = size_t(cfg_.n_embd), hd = size_t(cfg_.head_dim), ff = size_t(cfg_.n_ff);
    const size_t qd = size_t(cfg_.n_head) * hd, kvd = size_t(cfg_.n_head_kv) * hd;
    auto opt = [](const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); };
    for (const auto& l : fp_->layers) {
      LayerView L;
      L.attn_norm = l.attn_norm.data();
      L.ffn_norm = l.ffn_norm.data();
      L.bq = opt(l.bq);
      L.bk = opt(l.bk);
      L.bv = opt(l.bv);
      L.bo = opt(l.bo);
      L.sinks = opt(l.sinks);
      L.q_norm = opt(l.q_norm);
      L.k_norm = opt(l.k_norm);
      L.post_attn_norm = opt(l.post_attn_norm);
      L.post_ffn_norm = opt(l.post_ffn_norm);
      L.wq = make_fp(l.wq, d, qd);
      L.wk = make_fp(l.wk, d, kvd);
      L.wv = make_fp(l.wv, d, kvd);
      L.wo = make_fp(l.wo, qd, d);
      if (cfg_.is_moe()) {
        const size_t ne = size_t(cfg_.moe.n_expert), fe = size_t(cfg_.moe.n_ff_exp);
        L.router = make_fp(l.ffn_gate_inp, d, ne);
        L.gate_exps = experts_of(make_fp(l.gate_exps, d, ne * fe), ne);
        L.up_exps = experts_of(make_fp(l.up_exps, d, ne * fe), ne);
        L.down_exps = experts_of(make_fp(l.down_exps, fe, ne * d), ne);
        L.router_b = opt(l.gate_inp_b);
        L.gate_exps_b = opt(l.gate_exps_b);
        L.up_exps_b = opt(l.up_exps_b);
        L.down_exps_b = opt(l.down_exps_b);
        if (cfg_.moe.n_ff_shexp > 0) {
          const size_t fs = size_t(cfg_.moe.n_ff_shexp);
          L.shexp_gate = opt(l.gate_inp_shexp);
          L.gate_shexp = make_fp(l.gate_shexp, d, fs);
          L.up_shexp = make_fp(l.up_shexp, d, fs);
          L.down_shexp = make_fp(l.down_shexp, fs, d);
        }
      } else {
        L.gate = make_fp(l.w_gate, d, ff);
        L.up = make_fp(l.w_up, d, ff);
        L.down = make_fp(l.w_down, ff, d);
      }
      f_.layers.push_back(L);
    }
    f_.output_norm = fp_->output_norm.data();
    f_.lm_head = make_fp(fp_->lm_head(), d, size_t(cfg_.n_vocab));
  });
  return f_;
}

void SimdModel::embed(int32_t token, bool fp32, float* out) const {
  const size_t d = size_t(cfg_.n_embd);
  if (fp32) {
    std::memcpy(out, fp_->token_embd.data() + size_t(token) * d, d * sizeof(float));
    return;
  }
  const auto& tr = gg::type_traits(embd_->type);
  const size_t row_bytes = d / tr.block_size * tr.type_size;
  const uint8_t* rows = embd_bytes_.empty() ? file_.tensor_data(*embd_).data() : embd_bytes_.data();
  gg::dequantize_row(embd_->type, rows + size_t(token) * row_bytes, out, int64_t(d));
}

uint64_t SimdModel::quantized_bytes_per_token() const {
  uint64_t total = 0;
  for (const auto& t : file_.tensors()) total += t.n_bytes;
  return total;
}

// ------------------------------------------------------------------ SimdSession
SimdSession::SimdSession(SimdModel& model, const SimdSessionOptions& opt)
    : model_(model),
      c_(model.config()),
      w_(!opt.quantized                                           ? &model.full_precision()
         : opt.int8_activations && qlevel() == QLevel::AVX512VNNI ? &model.quantized_r16()
                                                                  : &model.quantized()),
      quant_(opt.quantized),
      int8_(opt.quantized && opt.int8_activations),
      faults_(opt.faults),
      max_ctx_(opt.max_context > 0 ? opt.max_context : model.config().n_ctx_train),
      opt_(opt),
      pool_(opt.n_threads > 0 ? opt.n_threads
                              : int(std::max(1u, std::thread::hardware_concurrency()))),
      // The reduction-order faults split work by thread: never governed.
      governed_(pool_.size() > 1 && !env_is("TOUCHSTONE_CPU_SIMD_SOLO_FALLBACK", "0") &&
                !opt.faults.thread_order_reduction && !opt.faults.session_order_reduction),
      governor_key_(pool_.size() * 4 + (quant_ ? 1 : 0) + (int8_ ? 2 : 0)) {
  const size_t kvd = size_t(c_.n_head_kv) * size_t(c_.head_dim);
  kv_ = std::make_shared<KvCache>(size_t(c_.n_layer) * size_t(max_ctx_) * kvd);
  reserve_scores(max_ctx_);
  rope_tables();
  if (faults_.session_order_reduction) {
    // The fault: the split depends on how many sessions this process opened
    // (a stand-in for a scheduling-dependent reduction order).
    static std::atomic<int> sessions{0};
    faults_.session_slices = 2 + sessions.fetch_add(1) % 16;
  }
  size_pass_scratch(kMaxBatch);
  if (faults_.quantized_only() && quant_) corrupt_quantized_copy(*w_);
}

void SimdSession::size_pass_scratch(size_t B) {
  const size_t d = size_t(c_.n_embd), hd = size_t(c_.head_dim), ff = size_t(c_.n_ff);
  const size_t qd = size_t(c_.n_head) * hd, kvd = size_t(c_.n_head_kv) * hd;
  pass_cap_ = B;
  x_.resize(B * d);
  xn_.resize(B * std::max(d, qd));
  q_.resize(B * qd);
  k_.resize(B * kvd);
  v_.resize(B * kvd);
  att_.resize(B * qd);
  tmp_.resize(B * d);
  const size_t ff_max = std::max({ff, size_t(c_.moe.n_ff_exp), size_t(c_.moe.n_ff_shexp)});
  gate_.resize(B * ff_max);
  up_.resize(B * ff_max);
  if (c_.is_moe()) {
    const size_t ne = size_t(c_.moe.n_expert), k = size_t(c_.moe.n_expert_used);
    moe_logits_.resize(B * ne);
    moe_x_.resize(B * d);
    moe_out_.resize(B * k * d);
    if (c_.moe.n_ff_shexp > 0) {
      moe_shared_.resize(B * d);
      moe_shared_gate_.resize(B);
    }
    moe_expert_.resize(B * k);
    moe_weight_.resize(B * k);
    moe_slots_.resize(B * k);
    moe_count_.resize(ne + 1);
    moe_fill_.reserve(ne);
  }
  tok_seg_.resize(B);
  blocks_.reserve(2 * B);
  rope_cs_.resize(rope_params_.size() * B * size_t(c_.n_rot));
  if (faults_.thread_order_reduction || faults_.session_order_reduction ||
      faults_.batch_token_count_split)
    partial_.resize(size_t(pool_.size()) * B * 128);
  const size_t max_in = std::max({d, qd, ff_max});
  act_qs_.resize(B * max_in);
  act_d_.resize(B * max_in / 32);
  act_s_.resize(B * max_in / 32);
  act_.resize(B);
  for (size_t i = 0; i < B; ++i) {
    act_[i] = ActRow{act_qs_.data() + i * max_in, act_d_.data() + i * max_in / 32,
                     act_s_.data() + i * max_in / 32};
  }
}

// One cos/sin table per distinct (RoPE base, linear scale) of the layers; with YaRN
// (gpt-oss) each table's frequencies and mscale (ops::yarn_frequencies).
void SimdSession::rope_tables() {
  for (const touchstone::LayerConfig& lc : c_.layers) {
    const std::pair<double, double> key{lc.rope_base * faults_.rope_base_scale, lc.rope_scale};
    auto it = std::find(rope_params_.begin(), rope_params_.end(), key);
    layer_rope_.push_back(int(it - rope_params_.begin()));
    if (it == rope_params_.end()) rope_params_.push_back(key);
  }
  if (c_.rope_yarn.factor != 0.0) {
    for (const auto& [base, scale] : rope_params_)
      rope_yarn_.push_back(touchstone::ops::yarn_frequencies(c_.rope_yarn, c_.n_rot, base));
  }
}

SimdSession::~SimdSession() {
  if (governed_ && env_is("TOUCHSTONE_CPU_SIMD_POOL_STATS", "1")) {
    const SoloGovernor g = model_.governor(governor_key_);
    std::fprintf(stderr,
                 "cpu_simd (%d threads): %llu decode steps parallel, %llu solo; median step "
                 "%.3f ms parallel, %.3f ms solo\n",
                 pool_.size(), static_cast<unsigned long long>(decode_steps_[0]),
                 static_cast<unsigned long long>(decode_steps_[1]), g.mean(false) * 1e3,
                 g.mean(true) * 1e3);
  }
}

SimdSession::KvCache::KvCache(size_t n_floats)
    : k(static_cast<float*>(std::calloc(n_floats, sizeof(float)))),
      v(static_cast<float*>(std::calloc(n_floats, sizeof(float)))) {
  if (!k || !v) {
    std::free(k);
    std::free(v);
    throw std::bad_alloc();
  }
}

SimdSession::KvCache::~KvCache() {
  std::free(k);
  std::free(v);
}

// quant_scale_min_swap / nibble_order: this session computes with a copy of the
// quantized matrices whose blocks are corrupted the way a kernel with that bug
// would read them (the scale d and the min m swapped; each byte's low and high
// 4-bit quants swapped). The model's blocks, the embedding rows (gathered with
// the reference dequantizer) and the full-precision path stay correct.
void SimdSession::corrupt_quantized_copy(const WeightSet& src) {
  namespace gg = touchstone::gguf;
  faulty_w_ = src;
  std::vector<Linear*> all;
  for (LayerView& L : faulty_w_.layers)
    for (Linear* w : L.matrices()) all.push_back(w);
  all.push_back(&faulty_w_.lm_head);
  size_t n_corrupted = 0;
  for (Linear* w : all) {
    if (!w->q) continue;
    const auto type = gg::TensorType(w->generic ? w->gtype : int(w->qtype));
    // Block layout (ggml-common.h): fp16 d, fp16 m / dmin (has_min), then the
    // 4-bit quants from byte qs (to the block's end).
    bool has_min = false;
    size_t qs = 0;
    switch (type) {
      case gg::TensorType::Q4_0:
        qs = 2;
        break;
      case gg::TensorType::Q4_1:
        has_min = true, qs = 4;
        break;
      case gg::TensorType::Q5_0:
        qs = 6;
        break;
      case gg::TensorType::Q5_1:
        has_min = true, qs = 8;
        break;
      case gg::TensorType::Q4_K:
        has_min = true, qs = 16;
        break;
      case gg::TensorType::Q5_K:
        has_min = true, qs = 48;
        break;
      default:
        continue;  // Q8_0, Q6_K, F16...: no 4-bit quants, no min
    }
    if (faults_.quant_scale_min_swap && !has_min) continue;
    const size_t bytes = w->row_bytes * w->n_out, bb = w->block_bytes;
    faulty_q_.emplace_back(w->q, w->q + bytes);
    uint8_t* q = faulty_q_.back().data();
    for (size_t b = 0; b + bb <= bytes; b += bb) {
      uint8_t* blk = q + b;
      if (faults_.quant_scale_min_swap) {
        std::swap(blk[0], blk[2]);
        std::swap(blk[1], blk[3]);
      } else {
        for (size_t i = qs; i < bb; ++i) blk[i] = uint8_t((blk[i] >> 4) | (blk[i] << 4));
      }
    }
    w->q = q;
    w->r16 = nullptr;  // the corrupted blocks, in the GGUF layout's kernel
    ++n_corrupted;
  }
  if (n_corrupted == 0) {
    throw StatusError(TS_ERR_UNSUPPORTED, "fault '" + faults_.name +
                                              "': this model has no quantized matrix it applies "
                                              "to (Q4_0/Q4_1/Q5_x/Q4_K/Q5_K)");
  }
  w_ = &faulty_w_;
}

// thread_order_reduction: rows [r0, r1) of W x with the input columns split into
// one slice per thread of the pool (whole 32-blocks), each slice's partial sums
// rounded to fp32 and added in thread order: the result depends on the thread
// count (one thread: the ordinary kernel's value). session_order_reduction:
// the session's slice count instead; batch_token_count_split (in step_batch):
// 2 + the batch's token count % 16 slices.
void SimdSession::linear_per_thread(const Linear& W, size_t r0, size_t r1, const float* x,
                                    size_t ldx, size_t n_tok, float* y, size_t ldy, int thread) {
  const size_t T = split_slices_ > 0                 ? size_t(split_slices_)
                   : faults_.session_order_reduction ? size_t(faults_.session_slices)
                                                     : size_t(pool_.size());
  const size_t be = W.f ? 1 : W.generic ? W.block_elems : 32;  // slice granularity
  const size_t nb = W.n_in / be, rows = r1 - r0;
  float* part = partial_.data() + size_t(thread) * pass_cap_ * 128;
  for (size_t k = 0; k < T; ++k) {
    const size_t b0 = nb * k / T, b1 = nb * (k + 1) / T, c0 = b0 * be, nc = (b1 - b0) * be;
    if (nc == 0) continue;
    float* out = k == 0 ? y + r0 : part;
    const size_t ld = k == 0 ? ldy : rows;
    if (W.f) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n_tok), int(rows), int(nc), 1.0f,
                  x + c0, int(ldx), W.f + r0 * W.n_in + c0, int(W.n_in), 0.0f, out, int(ld));
    } else {
      const uint8_t* q = W.q + r0 * W.row_bytes + b0 * W.block_bytes;
      if (W.generic) {
        gemm_blocks_f32(W.gtype, q, W.row_bytes, W.block_elems, W.block_bytes, 0, rows, x + c0, ldx,
                        n_tok, out, ld);
      } else if (int8_) {
        std::vector<ActRow> act(n_tok);
        for (size_t t = 0; t < n_tok; ++t)
          act[t] = ActRow{act_[t].qs + c0, act_[t].d + b0, act_[t].s + b0};
        gemm_q(W.qtype, q, W.row_bytes, b1 - b0, 0, rows, act.data(), n_tok, out, ld);
      } else {
        gemm_q_f32(W.qtype, q, W.row_bytes, b1 - b0, 0, rows, x + c0, ldx, n_tok, out, ld);
      }
    }
    if (k == 0) continue;
    for (size_t t = 0; t < n_tok; ++t)
      for (size_t r = 0; r < rows; ++r) y[t * ldy + r0 + r] += part[t * rows + r];
  }
}

// y_j[t][:] = W_j x[t] for every job j, all row chunks of all jobs in one pool run.
void SimdSession::linears(const Job* jobs, int n_jobs, const float* x, size_t ldx, size_t n_tok,
                          bool per_token) {
  const size_t n_in = jobs[0].w->n_in;
  if (int8_) {
    // int8 activations, one row per token (shared by all jobs of this call).
    pool_.run(n_tok, [&](size_t t, int) { quantize_act(x + t * ldx, n_in, act_[t]); });
  }
  // Rows per task, fixed: results never depend on thread count. Quantized
  // prefill: a multiple of the panel tiles' 6 (AVX3) and 3 (16-register) rows.
  const size_t chunk = n_tok == 1 ? 32 : quant_ ? 48 : 128;
  size_t first[4] = {0, 0, 0, 0};
  for (int j = 0; j < n_jobs; ++j) first[j + 1] = first[j] + ops::ceil_div(jobs[j].w->n_out, chunk);
  pool_.run(first[n_jobs], [&](size_t task, int thread) {
    int j = 0;
    while (task >= first[j + 1]) ++j;
    const Job& job = jobs[j];
    const Linear& W = *job.w;
    const size_t r0 = (task - first[j]) * chunk, r1 = std::min(W.n_out, r0 + chunk);
    if (faults_.thread_order_reduction || faults_.session_order_reduction || split_slices_ > 0) {
      linear_per_thread(W, r0, r1, x, ldx, n_tok, job.y, job.ldy, thread);
    } else if (W.f) {
      if (n_tok == 1 || quant_ || per_token) {
        // The quantized path's F32 matrices (tiny models) and the experts take the
        // matvec for every token count: a token's bits never depend on the other
        // tokens of the pass (batch invariance, docs/backends/cpu_simd.md).
        for (size_t t = 0; t < n_tok; ++t)
          matvec_f32(W.f + r0 * W.n_in, W.n_in, x + t * ldx, job.y + t * job.ldy + r0, r1 - r0,
                     W.n_in);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n_tok), int(r1 - r0), int(W.n_in),
                    1.0f, x, int(ldx), W.f + r0 * W.n_in, int(W.n_in), 0.0f, job.y + r0,
                    int(job.ldy));
      }
    } else if (int8_ && W.r16 && qlevel() == QLevel::AVX512VNNI) {
      gemm_q_r16(W.generic ? W.gtype : int(W.qtype), W.r16, W.n_in / 32, r0, r1, act_.data(), n_tok,
                 job.y, job.ldy);
    } else if (W.generic) {
      // (also in int8 mode without an r16 copy: no int8 kernel; fp32 activations)
      gemm_blocks_f32(W.gtype, W.q, W.row_bytes, W.block_elems, W.block_bytes, r0, r1, x, ldx,
                      n_tok, job.y, job.ldy);
    } else if (int8_) {
      gemm_q(W.qtype, W.q, W.row_bytes, W.n_in / 32, r0, r1, act_.data(), n_tok, job.y, job.ldy);
    } else {
      gemm_q_f32(W.qtype, W.q, W.row_bytes, W.n_in / 32, r0, r1, x, ldx, n_tok, job.y, job.ldy);
    }
    if (faults_.fp16_accumulation) {  // the fault: outputs rounded through fp16
      for (size_t t = 0; t < n_tok; ++t)
        for (size_t r = r0; r < r1; ++r) {
          float& v = job.y[t * job.ldy + r];
          v = touchstone::gguf::fp16_to_fp32(touchstone::gguf::fp32_to_fp16(v));
        }
    }
  });
}

}  // namespace touchstone::cpu_simd
