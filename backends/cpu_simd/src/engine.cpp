// engine.cpp - the cpu_simd forward pass. Same formulas as the reference
// (reference/model/src/llama_forward.cpp: RMSNorm, interleaved RoPE on GGUF's
// permuted Q/K rows, GQA, SwiGLU), batched over the tokens of a prefill chunk.
//
// Numerics (see docs/backends/cpu_simd.md):
//  * matrices: full precision = fp32 weights, fp32 accumulation (OpenBLAS sgemm
//    for several tokens, the Highway matvec for one); quantized = GGUF blocks x
//    int8 activations (kernels_quant.cpp).
//  * RMSNorm sums, RoPE angles and rotation, SiLU: fp64 like the reference,
//    rounded once to fp32.
//  * attention: fp32 scores (SIMD dot), fp32 softmax (max-subtracted vector
//    exp, lane-wise sum), fp32 weighted sum of V (kernels.h: attend_f32); KV
//    cache in fp32.
#include "engine.h"

#include <sys/mman.h>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "touchstone/backend_impl.h"
#include "touchstone/error.h"
#include "touchstone/quant.h"

namespace ts_cpu {

using touchstone::abi::StatusError;
namespace gg = touchstone::gguf;

namespace {

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

Linear make_quant(const gg::File& f, const std::string& name, size_t n_in, size_t n_out,
                  std::string* why) {
  Linear L;
  L.n_in = n_in;
  L.n_out = n_out;
  const gg::TensorInfo& t = f.tensor(name);
  if (t.shape.size() != 2 || t.shape[0] != n_in || t.shape[1] != n_out) {
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

// out = x / sqrt(mean(x^2) + eps) * w, fp64 sum like the reference.
void rms_norm(const float* x, const float* w, float* out, size_t n, double eps) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += double{x[i]} * double{x[i]};
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(double{x[i]} * inv * double{w[i]});
}

double noise_sign(uint64_t i) {  // identical to the reference's fault
  uint64_t z = i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return ((z ^ (z >> 31)) & 1u) ? 1.0 : -1.0;
}

}  // namespace

// ------------------------------------------------------------------ Model
Model::Model(const std::string& path) : file_(gg::File::open(path)) {
  cfg_ = touchstone::read_llama_config(file_);
  const size_t d = size_t(cfg_.n_embd), hd = size_t(cfg_.head_dim), ff = size_t(cfg_.n_ff);
  const size_t qd = size_t(cfg_.n_head) * hd, kvd = size_t(cfg_.n_head_kv) * hd;
  embd_ = &file_.tensor("token_embd.weight");
  auto norm = [&](const std::string& name) {
    const gg::TensorInfo& t = file_.tensor(name);
    if (t.n_elements != d) throw StatusError(TS_ERR_IO, path + ": " + name + " has the wrong size");
    norms_.push_back(gg::dequantize(file_, t));
    return norms_.back().data();
  };
  norms_.reserve(size_t(cfg_.n_layer) * 2 + 1);
  for (int32_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerView L;
    L.attn_norm = norm(b + "attn_norm.weight");
    L.ffn_norm = norm(b + "ffn_norm.weight");
    L.wq = make_quant(file_, b + "attn_q.weight", d, qd, &q_unsupported_);
    L.wk = make_quant(file_, b + "attn_k.weight", d, kvd, &q_unsupported_);
    L.wv = make_quant(file_, b + "attn_v.weight", d, kvd, &q_unsupported_);
    L.wo = make_quant(file_, b + "attn_output.weight", qd, d, &q_unsupported_);
    L.gate = make_quant(file_, b + "ffn_gate.weight", d, ff, &q_unsupported_);
    L.up = make_quant(file_, b + "ffn_up.weight", d, ff, &q_unsupported_);
    L.down = make_quant(file_, b + "ffn_down.weight", ff, d, &q_unsupported_);
    q_.layers.push_back(L);
  }
  q_.output_norm = norm("output_norm.weight");
  q_.lm_head = make_quant(file_, cfg_.tied_embeddings ? "token_embd.weight" : "output.weight", d,
                          size_t(cfg_.n_vocab), &q_unsupported_);
  if (!gg::can_dequantize(embd_->type)) {
    throw StatusError(TS_ERR_UNSUPPORTED, "token_embd.weight type cannot be dequantized");
  }
  if (q_unsupported_.empty()) {
    const char* e = std::getenv("TOUCHSTONE_CPU_SIMD_ARENA");
    if (!e || std::string(e) != "0") relocate_quantized();
  }
}

void Model::ArenaFree::operator()(uint8_t* p) const { std::free(p); }

// Decode streams every matrix once per token. Served from the model buffer the
// weights sit in 4 KiB pages: a TLB miss every 4 KiB and the
// hardware prefetchers restart at every page. One anonymous arena with
// MADV_HUGEPAGE (2 MiB pages where the kernel grants them), in the order the
// forward pass reads the matrices, removes both. The bytes are unchanged.
void Model::relocate_quantized() {
  constexpr size_t kAlign = size_t{2} << 20;
  std::vector<Linear*> all;
  for (LayerView& L : q_.layers) {
    for (Linear* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) all.push_back(w);
  }
  all.push_back(&q_.lm_head);
  size_t total = 0;
  for (const Linear* w : all) total += (w->row_bytes * w->n_out + 63) & ~size_t{63};
  total = (total + kAlign - 1) & ~(kAlign - 1);
  uint8_t* base = static_cast<uint8_t*>(std::aligned_alloc(kAlign, total));
  if (!base) return;  // keep serving from the mapping
  arena_.reset(base);
  madvise(base, total, MADV_HUGEPAGE);
  size_t off = 0;
  for (Linear* w : all) {
    const size_t n = w->row_bytes * w->n_out;
    std::memcpy(base + off, w->q, n);
    // The source stays as it is: gguf::File holds the model in private memory
    // (read, not mmap()ed, so truncating the file cannot SIGBUS us), and
    // MADV_DONTNEED on it would zero bytes that embed() reads again (tied head).
    w->q = base + off;
    off += (n + 63) & ~size_t{63};
  }
}

const WeightSet& Model::quantized() const {
  if (!q_unsupported_.empty()) throw StatusError(TS_ERR_UNSUPPORTED, q_unsupported_);
  return q_;
}

const WeightSet& Model::full_precision() {
  std::call_once(fp_once_, [&] {
    fp_ = std::make_unique<touchstone::LlamaWeights>(touchstone::load_llama_weights(file_));
    const size_t d = size_t(cfg_.n_embd), hd = size_t(cfg_.head_dim), ff = size_t(cfg_.n_ff);
    const size_t qd = size_t(cfg_.n_head) * hd, kvd = size_t(cfg_.n_head_kv) * hd;
    for (const auto& l : fp_->layers) {
      LayerView L;
      L.attn_norm = l.attn_norm.data();
      L.ffn_norm = l.ffn_norm.data();
      L.wq = make_fp(l.wq, d, qd);
      L.wk = make_fp(l.wk, d, kvd);
      L.wv = make_fp(l.wv, d, kvd);
      L.wo = make_fp(l.wo, qd, d);
      L.gate = make_fp(l.w_gate, d, ff);
      L.up = make_fp(l.w_up, d, ff);
      L.down = make_fp(l.w_down, ff, d);
      f_.layers.push_back(L);
    }
    f_.output_norm = fp_->output_norm.data();
    f_.lm_head = make_fp(fp_->lm_head(), d, size_t(cfg_.n_vocab));
  });
  return f_;
}

void Model::embed(int32_t token, bool fp32, float* out) const {
  const size_t d = size_t(cfg_.n_embd);
  if (fp32) {
    std::memcpy(out, fp_->token_embd.data() + size_t(token) * d, d * sizeof(float));
    return;
  }
  const auto& tr = gg::type_traits(embd_->type);
  const size_t row_bytes = d / tr.block_size * tr.type_size;
  gg::dequantize_row(embd_->type, file_.tensor_data(*embd_).data() + size_t(token) * row_bytes, out,
                     int64_t(d));
}

uint64_t Model::quantized_bytes_per_token() const {
  uint64_t total = 0;
  for (const auto& t : file_.tensors()) total += t.n_bytes;
  return total;
}

// ------------------------------------------------------------------ Session
Session::Session(Model& model, const SessionOptions& opt)
    : model_(model),
      c_(model.config()),
      w_(opt.quantized ? &model.quantized() : &model.full_precision()),
      quant_(opt.quantized),
      int8_(opt.quantized && opt.int8_activations),
      faults_(opt.faults),
      max_ctx_(opt.max_context > 0 ? opt.max_context : model.config().n_ctx_train),
      pool_(opt.n_threads > 0 ? opt.n_threads
                              : int(std::max(1u, std::thread::hardware_concurrency()))) {
  const size_t d = size_t(c_.n_embd), hd = size_t(c_.head_dim), ff = size_t(c_.n_ff);
  const size_t qd = size_t(c_.n_head) * hd, kvd = size_t(c_.n_head_kv) * hd;
  const size_t B = kMaxBatch;
  const size_t kv = size_t(c_.n_layer) * size_t(max_ctx_) * kvd;
  k_cache_ = static_cast<float*>(std::calloc(kv, sizeof(float)));
  v_cache_ = static_cast<float*>(std::calloc(kv, sizeof(float)));
  if (!k_cache_ || !v_cache_) {
    std::free(k_cache_);
    std::free(v_cache_);
    throw std::bad_alloc();
  }
  x_.resize(B * d);
  xn_.resize(B * std::max(d, qd));
  q_.resize(B * qd);
  k_.resize(B * kvd);
  v_.resize(B * kvd);
  att_.resize(B * qd);
  tmp_.resize(B * d);
  gate_.resize(B * ff);
  up_.resize(B * ff);
  scores_.resize(size_t(pool_.size()) * size_t(max_ctx_));
  rope_cs_.resize(B * hd);
  const size_t max_in = std::max({d, qd, ff});
  act_qs_.resize(B * max_in);
  act_d_.resize(B * max_in / 32);
  act_s_.resize(B * max_in / 32);
  act_.resize(B);
  for (size_t i = 0; i < B; ++i) {
    act_[i] = ActRow{act_qs_.data() + i * max_in, act_d_.data() + i * max_in / 32,
                     act_s_.data() + i * max_in / 32};
  }
  const double base = double{c_.rope_freq_base} * faults_.rope_base_scale;
  for (size_t i = 0; i < hd / 2; ++i) {
    inv_freq_.push_back(std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(hd)));
  }
}

Session::~Session() {
  std::free(k_cache_);
  std::free(v_cache_);
}

void Session::forward(const int32_t* tokens, int32_t n, bool all_positions, float* logits) {
  const size_t V = size_t(c_.n_vocab);
  for (int32_t i = 0; i < n; i += kMaxBatch) {
    const int32_t m = std::min(kMaxBatch, n - i);
    const bool last = i + m == n;
    if (!all_positions && !last) {
      forward_chunk(tokens + i, m, false, nullptr);
    } else {
      forward_chunk(tokens + i, m, all_positions, all_positions ? logits + size_t(i) * V : logits);
    }
  }
}

// y_j[t][:] = W_j x[t] for every job j, all row chunks of all jobs in one pool run.
void Session::linears(const Job* jobs, int n_jobs, const float* x, size_t ldx, size_t n_tok) {
  const size_t n_in = jobs[0].w->n_in;
  if (int8_) {
    // int8 activations, one row per token (shared by all jobs of this call).
    pool_.run(n_tok, [&](size_t t, int) { quantize_act(x + t * ldx, n_in, act_[t]); });
  }
  const size_t chunk =
      quant_ || n_tok == 1 ? 32 : 128;  // fixed: results never depend on thread count
  size_t first[4] = {0, 0, 0, 0};
  for (int j = 0; j < n_jobs; ++j) first[j + 1] = first[j] + ceil_div(jobs[j].w->n_out, chunk);
  pool_.run(first[n_jobs], [&](size_t task, int) {
    int j = 0;
    while (task >= first[j + 1]) ++j;
    const Job& job = jobs[j];
    const Linear& W = *job.w;
    const size_t r0 = (task - first[j]) * chunk, r1 = std::min(W.n_out, r0 + chunk);
    if (W.generic) {
      // (also in int8 mode: these types have no int8 kernel; fp32 activations)
      gemm_blocks_f32(W.gtype, W.q, W.row_bytes, W.block_elems, W.block_bytes, r0, r1, x, ldx,
                      n_tok, job.y, job.ldy);
    } else if (int8_) {
      gemm_q(W.qtype, W.q, W.row_bytes, W.n_in / 32, r0, r1, act_.data(), n_tok, job.y, job.ldy);
    } else if (quant_) {
      gemm_q_f32(W.qtype, W.q, W.row_bytes, W.n_in / 32, r0, r1, x, ldx, n_tok, job.y, job.ldy);
    } else if (n_tok == 1) {
      matvec_f32(W.f + r0 * W.n_in, W.n_in, x, job.y + r0, r1 - r0, W.n_in);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n_tok), int(r1 - r0), int(W.n_in),
                  1.0f, x, int(ldx), W.f + r0 * W.n_in, int(W.n_in), 0.0f, job.y + r0,
                  int(job.ldy));
    }
  });
}

void Session::attention(int32_t layer, int32_t n) {
  const size_t hd = size_t(c_.head_dim), kvd = size_t(c_.n_head_kv) * hd,
               qd = size_t(c_.n_head) * hd;
  const int32_t group = c_.n_head / c_.n_head_kv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const float* K = k_cache_ + size_t(layer) * size_t(max_ctx_) * kvd;
  const float* V = v_cache_ + size_t(layer) * size_t(max_ctx_) * kvd;
  pool_.run(size_t(n) * size_t(c_.n_head), [&](size_t task, int thread) {
    const size_t i = task / size_t(c_.n_head), h = task % size_t(c_.n_head);
    const int32_t p = pos_ + int32_t(i);
    const int32_t n_kv = (faults_.kv_off_by_one && p > 0) ? p : p + 1;
    const float* qh = q_.data() + i * qd + h * hd;
    const size_t off = size_t(int32_t(h) / group) * hd;
    float* s = scores_.data() + size_t(thread) * size_t(max_ctx_);
    attend_f32(qh, K + off, V + off, kvd, hd, size_t(n_kv), scale, s,
               att_.data() + i * qd + h * hd);
  });
}

void Session::forward_chunk(const int32_t* tokens, int32_t n, bool all_positions, float* logits) {
  const size_t d = size_t(c_.n_embd), hd = size_t(c_.head_dim), ff = size_t(c_.n_ff);
  const size_t qd = size_t(c_.n_head) * hd, kvd = size_t(c_.n_head_kv) * hd;
  const size_t N = size_t(n);
  const double eps = c_.rms_norm_eps;

  for (size_t i = 0; i < N; ++i) model_.embed(tokens[i], !quant_, x_.data() + i * d);
  // RoPE angles depend on the position only: cos/sin once per chunk, not per
  // layer and head (same fp64 formulas, same values).
  pool_.run(N, [&](size_t i, int) {
    const double pos = static_cast<double>(pos_ + int32_t(i));
    double* cs_sn = rope_cs_.data() + i * hd;
    for (size_t j = 0; j < hd / 2; ++j) {
      const double theta = pos * inv_freq_[j];
      cs_sn[2 * j] = std::cos(theta);
      cs_sn[2 * j + 1] = std::sin(theta);
    }
  });

  for (int32_t l = 0; l < c_.n_layer; ++l) {
    const LayerView& L = w_->layers[size_t(l)];
    float* Kl = k_cache_ + size_t(l) * size_t(max_ctx_) * kvd;
    float* Vl = v_cache_ + size_t(l) * size_t(max_ctx_) * kvd;

    for (size_t i = 0; i < N; ++i)
      rms_norm(x_.data() + i * d, L.attn_norm, xn_.data() + i * d, d, eps);
    const Job qkv[3] = {{&L.wq, q_.data(), qd}, {&L.wk, k_.data(), kvd}, {&L.wv, v_.data(), kvd}};
    linears(qkv, 3, xn_.data(), d, N);
    // RoPE (interleaved pairs, fp64 rotation) and KV append.
    pool_.run(N, [&](size_t i, int) {
      auto rope = [&](float* v) {
        const double* cs_sn = rope_cs_.data() + i * hd;
        for (size_t j = 0; j < hd / 2; ++j) {
          const double cs = cs_sn[2 * j], sn = cs_sn[2 * j + 1];
          const double x0 = v[2 * j], x1 = v[2 * j + 1];
          v[2 * j] = static_cast<float>(x0 * cs - x1 * sn);
          v[2 * j + 1] = static_cast<float>(x0 * sn + x1 * cs);
        }
      };
      for (int32_t h = 0; h < c_.n_head; ++h) rope(q_.data() + i * qd + size_t(h) * hd);
      for (int32_t h = 0; h < c_.n_head_kv; ++h) rope(k_.data() + i * kvd + size_t(h) * hd);
      const size_t p = size_t(pos_) + i;
      std::memcpy(Kl + p * kvd, k_.data() + i * kvd, kvd * sizeof(float));
      std::memcpy(Vl + p * kvd, v_.data() + i * kvd, kvd * sizeof(float));
    });
    attention(l, n);
    const Job o[1] = {{&L.wo, tmp_.data(), d}};
    linears(o, 1, att_.data(), qd, N);
    for (size_t i = 0; i < N * d; ++i) x_[i] += tmp_[i];

    for (size_t i = 0; i < N; ++i)
      rms_norm(x_.data() + i * d, L.ffn_norm, xn_.data() + i * d, d, eps);
    const Job gu[2] = {{&L.gate, gate_.data(), ff}, {&L.up, up_.data(), ff}};
    linears(gu, 2, xn_.data(), d, N);
    // Elementwise, split into fixed slices of kSiluSlice so decode (one token)
    // uses every thread too.
    constexpr size_t kSiluSlice = 256;
    const size_t n_slices = ceil_div(ff, kSiluSlice);
    pool_.run(N * n_slices, [&](size_t task, int) {
      const size_t i = task / n_slices, j0 = (task % n_slices) * kSiluSlice;
      float* g = gate_.data() + i * ff;
      const float* u = up_.data() + i * ff;
      for (size_t j = j0; j < std::min(ff, j0 + kSiluSlice); ++j) {
        const double gj = g[j];
        g[j] = static_cast<float>(gj / (1.0 + std::exp(-gj)) * double{u[j]});
      }
    });
    const Job dn[1] = {{&L.down, tmp_.data(), d}};
    linears(dn, 1, gate_.data(), ff, N);
    for (size_t i = 0; i < N * d; ++i) x_[i] += tmp_[i];
  }

  if (logits) {
    const size_t V = size_t(c_.n_vocab);
    const size_t first = all_positions ? 0 : N - 1, rows = N - first;
    for (size_t i = first; i < N; ++i) {
      rms_norm(x_.data() + i * d, w_->output_norm, xn_.data() + (i - first) * d, d, eps);
    }
    const Job head[1] = {{&w_->lm_head, logits, V}};
    linears(head, 1, xn_.data(), d, rows);
    if (faults_.logit_noise != 0.0) {
      for (size_t r = 0; r < rows; ++r) {
        const uint64_t base = uint64_t(pos_ + int32_t(first + r)) * uint64_t(V);
        float* row = logits + r * V;
        for (size_t i = 0; i < V; ++i) {
          row[i] = static_cast<float>(double{row[i]} *
                                      (1.0 + faults_.logit_noise * noise_sign(base + i)));
        }
      }
    }
  }
  pos_ += n;
}

}  // namespace ts_cpu
