// template_backend.cpp - a complete Touchstone backend as a C++20 class: scalar, one thread,
// Llama only. Copy it to start a backend (docs/writing-a-backend.md).
//
// touchstone::BackendAdapter<TemplateBackend> (touchstone/abi/backend_adapter.hpp) builds the C
// table of touchstone/abi/backend_abi.h from this class and applies the checks every backend shares
// (null pointers, struct sizes, token ids, room in the KV cache, rewind range); exceptions become
// statuses (StatusError(status, message), std::bad_alloc -> TS_ERR_OUT_OF_MEMORY).
//
// The model: the GGUF is read here, every weight dequantized to fp32 at load (full_precision;
// the quantized path is refused with TS_ERR_UNSUPPORTED), and the forward pass is
// reference/transformer's: RMSNorm, interleaved RoPE, GQA attention, SwiGLU FFN, in fp32 (RoPE
// angles in double). A token's result does not depend on how tokens are split into calls, so
// prefill(n) equals n decode steps bit for bit (TS_CAP_BITWISE_DETERMINISM).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "touchstone/abi/backend_adapter.hpp"

namespace {

using touchstone::abi::StatusError;
using Floats = std::vector<float>;
constexpr uint32_t kF32 = 0, kQ4_1 = 3, kQ8_0 = 8;  // the ggml types read (those of SmolLM2 Q4_1)

// A GGUF file (ggml/docs/gguf.md) read into memory; every read is checked against its size.
class Gguf {
 public:
  struct Tensor {
    std::vector<uint64_t> dims;
    uint32_t type = 0;
    uint64_t offset = 0;
  };
  std::map<std::string, double> numbers;  // the UINT32 / FLOAT32 metadata values, by key
  std::map<std::string, Tensor> tensors;

  explicit Gguf(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    std::ifstream f(path_, std::ios::binary | std::ios::ate);
    if (!std::filesystem::is_regular_file(path_, ec) || !f) fail(TS_ERR_IO, "cannot open");
    bytes_.resize(size_t(f.tellg()));
    if (!f.seekg(0).read(reinterpret_cast<char*>(bytes_.data()), std::streamsize(bytes_.size())))
      fail(TS_ERR_IO, "cannot read");
    if (get<uint32_t>("magic") != 0x46554747) fail(TS_ERR_IO, "magic: not a GGUF file");
    const auto version = get<uint32_t>("version");
    if (version != 2 && version != 3) fail(TS_ERR_IO, "version " + std::to_string(version));
    const auto n_tensors = get<uint64_t>("tensor count"), n_kv = get<uint64_t>("key count");
    std::string arch;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const std::string key = string("metadata key #" + std::to_string(i));
      const auto type = get<uint32_t>(key);
      if (type == 4)
        numbers[key] = get<uint32_t>(key);  // UINT32, FLOAT32: as llama.cpp writes
      else if (type == 6)
        numbers[key] = get<float>(key);
      else if (type == 8 && key == "general.architecture")
        arch = string(key);
      else
        skip(type, key);
    }
    if (arch != "llama")
      fail(TS_ERR_UNSUPPORTED, "general.architecture '" + arch + "': only llama is supported");
    for (uint64_t i = 0; i < n_tensors; ++i) {
      const std::string name = string("tensor info #" + std::to_string(i));
      if (tensors.contains(name)) fail(TS_ERR_IO, "tensor " + name + " appears twice");
      Tensor& t = tensors[name];
      const auto n_dims = get<uint32_t>(name + ": n_dims");  // checked before it sizes anything
      if (n_dims > 4) fail(TS_ERR_IO, name + ": more than 4 dimensions");
      t.dims.resize(n_dims);
      for (uint64_t& d : t.dims) d = get<uint64_t>(name + ": dims");
      t.type = get<uint32_t>(name + ": type");
      t.offset = get<uint64_t>(name + ": offset");
    }
    const double align = number("general.alignment", 32);
    if (!(align >= 1 && align <= 1 << 30) || (uint64_t(align) & (uint64_t(align) - 1)))
      fail(TS_ERR_IO, "general.alignment is not a power of two");
    data_ = (pos_ + uint64_t(align) - 1) / uint64_t(align) * uint64_t(align);
  }

  [[noreturn]] void fail(ts_status status, const std::string& what) const {
    throw StatusError(status, path_ + ": " + what.substr(0, 300));  // keys may be garbage
  }
  double number(const std::string& key, double fallback) const {
    const auto it = numbers.find(key);
    return it == numbers.end() ? fallback : it->second;
  }
  // Tensor `name`, of ggml shape `shape` ({n} or {ne0, ne1}), dequantized to fp32 with ggml's
  // dequantize_row_* formulas.
  Floats load(const std::string& name, std::vector<uint64_t> shape) const {
    const auto it = tensors.find(name);
    if (it == tensors.end()) fail(TS_ERR_IO, "tensor " + name + " not found");
    const Tensor& t = it->second;
    const bool quant = t.type == kQ4_1 || t.type == kQ8_0;
    if (t.type != kF32 && !(quant && shape[0] % 32 == 0))
      fail(TS_ERR_UNSUPPORTED,
           name + ": ggml type " + std::to_string(t.type) + " (F32, Q4_1, Q8_0 are read)");
    if (t.dims != shape) fail(TS_ERR_IO, name + ": unexpected shape");
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    const uint64_t block = t.type == kQ4_1 ? 20 : 34, size = quant ? n / 32 * block : n * 4;
    if (data_ > bytes_.size() || t.offset > bytes_.size() - data_ ||
        size > bytes_.size() - data_ - t.offset)
      fail(TS_ERR_IO, name + ": data offset " + std::to_string(t.offset) + " is past the end");
    const uint8_t* q = bytes_.data() + data_ + t.offset;
    Floats w(n);
    if (!quant) std::memcpy(w.data(), q, size);
    for (uint64_t i = 0; quant && i < n; i += 32, q += block) {
      const float d = half(q), m = half(q + 2);
      for (int j = 0; t.type == kQ4_1 && j < 16; ++j) {  // {fp16 d, fp16 m, 16 bytes of nibbles}
        w[i + j] = float(q[4 + j] & 15) * d + m;
        w[i + j + 16] = float(q[4 + j] >> 4) * d + m;
      }
      for (int j = 0; t.type == kQ8_0 && j < 32; ++j) w[i + j] = float(int8_t(q[2 + j])) * d;
    }
    return w;
  }

 private:
  template <typename T>
  T get(const std::string& field) {
    T v;
    if (sizeof(T) > bytes_.size() - pos_) fail(TS_ERR_IO, field + ": truncated");
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& field) {
    const auto n = get<uint64_t>(field);
    if (n > bytes_.size() - pos_) fail(TS_ERR_IO, field + ": truncated");
    pos_ += n;
    return {reinterpret_cast<const char*>(bytes_.data() + pos_ - n), size_t(n)};
  }
  // Skips a metadata value: a scalar, a string or an array of either.
  void skip(uint32_t type, const std::string& key) {
    static constexpr uint8_t kSize[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    uint64_t n = 1;
    if (type == 9) type = get<uint32_t>(key), n = get<uint64_t>(key);
    if (type == 8) {
      for (uint64_t i = 0; i < n; ++i) string(key);
    } else if (type >= 13 || kSize[type] == 0 || n > (bytes_.size() - pos_) / kSize[type]) {
      fail(TS_ERR_IO, key + ": bad value type or truncated");
    } else {
      pos_ += n * kSize[type];
    }
  }
  static float half(const uint8_t* p) {  // IEEE fp16 -> fp32, exact
    const int h = p[0] | p[1] << 8, e = (h >> 10) & 31, m = h & 1023;
    const float v =
        e == 31 ? (m ? NAN : INFINITY) : std::ldexp(float(e ? m | 1024 : m), (e ? e : 1) - 25);
    return (h & 0x8000) ? -v : v;
  }

  std::string path_;
  std::vector<uint8_t> bytes_;
  uint64_t pos_ = 0, data_ = 0;
};

float dot(const float* a, const float* b, int n) {  // 8 independent fp32 partial sums
  float s[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}
// Y[t][o] = W[o] . X[t] for n tokens; W has n_out rows of n_in (ggml shape [n_in, n_out]).
void matmul(const Floats& W, const float* X, float* Y, int n, int n_in, int n_out) {
  for (int o = 0; o < n_out; ++o)
    for (int t = 0; t < n; ++t)
      Y[size_t(t) * n_out + o] = dot(&W[size_t(o) * n_in], X + t * n_in, n_in);
}
void rms_norm(const float* x, const Floats& w, float* out, int n, float eps) {
  const float inv = 1.0f / std::sqrt(dot(x, x, n) / float(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * w[size_t(i)];
}
// Interleaved ("normal") RoPE: pairs (2i, 2i+1) of each head turn by pos * base^(-2i/hd).
void rope(float* x, int n_heads, int hd, int pos, double base) {
  for (int i = 0; i < hd / 2; ++i) {
    const double th = pos * std::pow(base, -2.0 * i / hd), c = std::cos(th), s = std::sin(th);
    for (float* v = x + 2 * i; v < x + n_heads * hd; v += hd) {
      const double x0 = v[0], x1 = v[1];
      v[0] = float(x0 * c - x1 * s), v[1] = float(x0 * s + x1 * c);
    }
  }
}

struct TemplateBackend {
  static constexpr const char* name = "template_cpp";
  static constexpr const char* version = "0.1.0";
  static constexpr const char* architectures = "llama";  // plain Llama models only (ABI v3)
  static constexpr const char* model_features = "";      // docs/model-families.md

  struct Model {
    enum { kAttnNorm, kWq, kWk, kWv, kWo, kFfnNorm, kGate, kUp, kDown, kN };
    int n_layer = 0, n_ctx = 0, d = 0, n_ff = 0, n_head = 0, n_head_kv = 0, hd = 0, vocab = 0;
    double rope_base = 0, eps = 0;
    Floats tok_embd, out_norm, output;           // output empty: the LM head is tok_embd (tied)
    std::vector<std::array<Floats, kN>> layers;  // weights of ggml shape [inputs, outputs]
    int32_t n_vocab() const { return vocab; }
    const Floats& lm_head() const { return output.empty() ? tok_embd : output; }
  };

  struct Session {
    static constexpr int kChunk = 32;  // prefill computes up to kChunk tokens per weight pass
    const Model& m;
    int pos = 0, max_ctx;
    std::unique_ptr<float[]> k = kv_cache(), v = kv_cache();          // [n_layer][max_ctx][kv dim]
    Floats x = Floats(size_t(kChunk) * m.d), xn = x, q = x, att = x;  // kChunk rows each
    Floats gate = Floats(size_t(kChunk) * m.n_ff), up = gate, scores = Floats(size_t(max_ctx));

    Session(const Model& model, int ctx) : m(model), max_ctx(ctx) {}
    std::unique_ptr<float[]> kv_cache() const {  // not zeroed: entries are written before read
      return std::make_unique_for_overwrite<float[]>(size_t(m.n_layer) * size_t(max_ctx) *
                                                     size_t(m.n_head_kv * m.hd));
    }
    int32_t position() const { return pos; }
    int32_t max_context() const { return max_ctx; }
    void rewind(int32_t p) { pos = p; }  // later tokens overwrite the entries past p

    void prefill(std::span<const int32_t> tokens, bool all, float* logits) {
      const int n = int(tokens.size());
      for (int i = 0, c; i < n; i += c) {  // kChunk tokens at a time; logits of the last, or all
        c = std::min(kChunk, n - i);
        float* out = all ? logits + size_t(i) * m.vocab : i + c == n ? logits : nullptr;
        forward(tokens.subspan(size_t(i), size_t(c)), out, all);
      }
    }

    // Appends the tokens (<= kChunk); logits of every row (all) or of the last (if logits).
    void forward(std::span<const int32_t> tokens, float* logits, bool all) {
      const int n = int(tokens.size()), d = m.d, hd = m.hd, kvd = m.n_head_kv * hd, ff = m.n_ff;
      const float eps = float(m.eps);
      for (int t = 0; t < n; ++t)
        std::copy_n(&m.tok_embd[size_t(tokens[t]) * d], d, &x[size_t(t * d)]);
      for (int l = 0; l < m.n_layer; ++l) {
        const auto& w = m.layers[size_t(l)];
        float* K = k.get() + size_t(l) * max_ctx * kvd;  // this layer's cache at position 0
        float* V = v.get() + size_t(l) * max_ctx * kvd;
        for (int t = 0; t < n; ++t) rms_norm(&x[t * d], w[Model::kAttnNorm], &xn[t * d], d, eps);
        matmul(w[Model::kWq], xn.data(), q.data(), n, d, d);
        matmul(w[Model::kWk], xn.data(), K + size_t(pos) * kvd, n, d, kvd);  // k, v into the cache
        matmul(w[Model::kWv], xn.data(), V + size_t(pos) * kvd, n, d, kvd);
        for (int t = 0; t < n; ++t) {
          rope(&q[t * d], m.n_head, hd, pos + t, m.rope_base);
          rope(K + size_t(pos + t) * kvd, m.n_head_kv, hd, pos + t, m.rope_base);
        }
        // Causal: token t sees positions 0 .. pos + t. GQA: query head h reads KV head h / group.
        for (int t = 0, group = m.n_head / m.n_head_kv; t < n; ++t)
          for (int h = 0; h < m.n_head; ++h)
            attend(&q[t * d + h * hd], K + h / group * hd, V + h / group * hd, pos + t + 1, kvd,
                   &att[t * d + h * hd]);
        matmul(w[Model::kWo], att.data(), xn.data(), n, d, d);
        for (int i = 0; i < n * d; ++i) x[i] += xn[i];
        for (int t = 0; t < n; ++t) rms_norm(&x[t * d], w[Model::kFfnNorm], &xn[t * d], d, eps);
        matmul(w[Model::kGate], xn.data(), gate.data(), n, d, ff);
        matmul(w[Model::kUp], xn.data(), up.data(), n, d, ff);
        for (int i = 0; i < n * ff; ++i) gate[i] *= up[i] / (1.0f + std::exp(-gate[i]));  // SwiGLU
        matmul(w[Model::kDown], gate.data(), xn.data(), n, ff, d);
        for (int i = 0; i < n * d; ++i) x[i] += xn[i];
      }
      pos += n;
      if (!logits) return;
      const int t0 = all ? 0 : n - 1;  // the rows whose logits are wanted
      for (int t = t0; t < n; ++t) rms_norm(&x[t * d], m.out_norm, &xn[t * d], d, eps);
      matmul(m.lm_head(), &xn[t0 * d], logits, n - t0, d, m.vocab);
    }

    // out = softmax_j(q . K[j] / sqrt(hd)) . V[j] over j < n; K, V rows `stride` floats apart.
    void attend(const float* qh, const float* K, const float* V, int n, int stride, float* out) {
      float mx = -INFINITY, sum = 0;
      for (int j = 0; j < n; ++j)
        mx = std::max(mx,
                      scores[j] = dot(qh, K + size_t(j) * stride, m.hd) / std::sqrt(float(m.hd)));
      for (int j = 0; j < n; ++j) sum += scores[j] = std::exp(scores[j] - mx);
      std::fill_n(out, m.hd, 0.0f);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m.hd; ++i) out[i] += scores[j] * V[size_t(j) * stride + i];
      for (int i = 0; i < m.hd; ++i) out[i] /= sum;
    }
  };

  static std::string device_name() { return "CPU (scalar C++ template, 1 thread)"; }
  static void capabilities(ts_capabilities& caps) {
    caps.flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BITWISE_DETERMINISM;
    caps.weight_types =
        TS_WEIGHT_TYPE_BIT(kF32) | TS_WEIGHT_TYPE_BIT(kQ4_1) | TS_WEIGHT_TYPE_BIT(kQ8_0);
  }

  static std::unique_ptr<Model> load_model(const std::string& path) {
    const Gguf g(path);
    // Any "llama." key beyond these changes the model (rope scaling, sliding window...): refused.
    for (const auto& [key, value] : g.numbers) {
      static const std::vector<std::string> known = {
          "block_count",          "context_length",
          "embedding_length",     "feed_forward_length",
          "attention.head_count", "attention.head_count_kv",
          "rope.freq_base",       "attention.layer_norm_rms_epsilon",
          "vocab_size",           "rope.dimension_count",
          "attention.key_length", "attention.value_length"};
      if (key.starts_with("llama.") &&
          std::find(known.begin(), known.end(), key.substr(6)) == known.end())
        g.fail(TS_ERR_UNSUPPORTED, "metadata key " + key + " is not supported");
    }
    auto int_key = [&](const std::string& key, double fallback) {
      const double v = g.number("llama." + key, fallback);
      if (!(v >= 1 && v < 1 << 24)) g.fail(TS_ERR_IO, "llama." + key + " missing or out of range");
      return int(v);
    };
    auto m = std::make_unique<Model>();
    m->n_layer = int_key("block_count", NAN), m->n_ctx = int_key("context_length", NAN);
    m->d = int_key("embedding_length", NAN), m->n_ff = int_key("feed_forward_length", NAN);
    m->n_head = int_key("attention.head_count", NAN),
    m->n_head_kv = int_key("attention.head_count_kv", m->n_head);
    m->hd = m->d / m->n_head, m->rope_base = g.number("llama.rope.freq_base", 10000.0);
    m->eps = g.number("llama.attention.layer_norm_rms_epsilon", NAN);
    const auto emb = g.tensors.find("token_embd.weight");
    m->vocab =
        emb != g.tensors.end() && emb->second.dims.size() == 2 && emb->second.dims[1] < 1 << 30
            ? int(emb->second.dims[1])
            : 0;
    if (m->n_head % m->n_head_kv || m->d % m->n_head || m->hd % 2 || !(m->rope_base > 0) ||
        !(m->eps > 0) || !m->vocab || g.number("llama.vocab_size", m->vocab) != m->vocab)
      g.fail(TS_ERR_IO, "head counts, rope.freq_base, rms epsilon or vocabulary size out of range");
    for (const char* key : {"llama.rope.dimension_count", "llama.attention.key_length",
                            "llama.attention.value_length"})
      if (g.number(key, m->hd) != m->hd)
        g.fail(TS_ERR_UNSUPPORTED, std::string(key) + " != head dim " + std::to_string(m->hd));
    const bool tied = !g.tensors.contains("output.weight");  // a plain Llama has exactly these:
    if (g.tensors.size() != 2 + !tied + size_t(Model::kN) * size_t(m->n_layer))
      g.fail(TS_ERR_UNSUPPORTED, "tensors other than a plain Llama's");

    const uint64_t d = uint64_t(m->d), kvd = uint64_t(m->n_head_kv * m->hd), ff = uint64_t(m->n_ff),
                   V = uint64_t(m->vocab);
    m->tok_embd = g.load("token_embd.weight", {d, V});
    m->out_norm = g.load("output_norm.weight", {d});
    if (!tied) m->output = g.load("output.weight", {d, V});
    static const char* const kNames[Model::kN] = {"attn_norm", "attn_q",      "attn_k",
                                                  "attn_v",    "attn_output", "ffn_norm",
                                                  "ffn_gate",  "ffn_up",      "ffn_down"};
    const std::vector<uint64_t> shapes[Model::kN] = {{d}, {d, d},  {d, kvd}, {d, kvd}, {d, d},
                                                     {d}, {d, ff}, {d, ff},  {ff, d}};
    m->layers.resize(size_t(m->n_layer));
    for (int l = 0; l < m->n_layer; ++l)
      for (int i = 0; i < Model::kN; ++i)
        m->layers[size_t(l)][size_t(i)] =
            g.load("blk." + std::to_string(l) + "." + kNames[i] + ".weight", shapes[i]);
    return m;
  }

  static std::unique_ptr<Session> open_session(Model& m, const ts_session_options& o) {
    if (o.fault && *o.fault)  // test-only fault injection by name: this template implements none
      throw StatusError(TS_ERR_UNSUPPORTED, std::string("unknown fault '") + o.fault + "'");
    if (o.weight_path == TS_WEIGHTS_QUANTIZED)
      throw StatusError(TS_ERR_UNSUPPORTED, "quantized weights: not implemented");
    return std::make_unique<Session>(m, o.max_context ? o.max_context : m.n_ctx);
  }
};

}  // namespace

TOUCHSTONE_BACKEND_ENTRY(TemplateBackend)
