/* template_backend.c - a complete Touchstone backend in C11: scalar, one thread, Llama only.
 * Copy it to start a backend (docs/writing-a-backend.md); the contract is
 * touchstone/abi/backend_abi.h. It reads the GGUF (every read checked against the file size),
 * dequantizes the weights to fp32 at load (full_precision; quantized is refused) and runs
 * reference/transformer's forward pass: RMSNorm, interleaved RoPE, GQA attention, SwiGLU, in fp32
 * (RoPE angles in double). A token's result does not depend on how tokens are split into calls:
 * prefill(n) == n decode steps, bit for bit. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "touchstone/abi/backend_abi.h"

static _Thread_local char g_error[1024]; /* last_error() is per thread (the contract) */
static const char* last_error(void) { return g_error; }
static ts_status fail(ts_status status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_error, sizeof g_error, fmt, ap);
  va_end(ap);
  return status;
}
#define REQUIRE(ok, status, ...) /* unless ok: return status, message for last_error() */ \
  if (!(ok)) return fail(status, __VA_ARGS__)
/* GGUF (ggml/docs/gguf.md) is little-endian. */
enum { F32 = 0, Q4_1 = 3, Q8_0 = 8 }; /* the ggml tensor types read (those of SmolLM2 Q4_1) */
enum { K_LAYER, K_CTX, K_EMBD, K_FF, K_HEAD, K_HKV, K_BASE, K_EPS, K_VOCAB, K_ROT, K_KLEN, K_VLEN };
enum { K_ALIGN = K_VLEN + 1, N_KEYS }; /* K_ROT .. K_VLEN must equal the head dim if present */
static const char* const kKeys[N_KEYS] = {
    "llama.block_count",          "llama.context_length",
    "llama.embedding_length",     "llama.feed_forward_length",
    "llama.attention.head_count", "llama.attention.head_count_kv",
    "llama.rope.freq_base",       "llama.attention.layer_norm_rms_epsilon",
    "llama.vocab_size",           "llama.rope.dimension_count",
    "llama.attention.key_length", "llama.attention.value_length",
    "general.alignment"};
typedef struct {
  const char* name;
  uint64_t name_len, dims[4], offset;
  uint32_t n_dims, type;
} TensorInfo;
typedef struct {
  const char* path;
  unsigned char* buf;                  /* the whole file */
  uint64_t size, pos, data, n_tensors; /* data: where the data section starts */
  double kv[N_KEYS];                   /* the value of kKeys[k]; NaN: absent */
  TensorInfo* t;
} Gguf;
/* Copies n bytes at the cursor into out (NULL: skips them); 0 when the file ends first. */
static int get(Gguf* g, void* out, uint64_t n) {
  if (n > g->size - g->pos) return 0;
  if (out) memcpy(out, g->buf + g->pos, n);
  return g->pos += n, 1;
}
/* Skips a metadata value: a scalar, a string (u64 length, bytes) or an array of either. */
static int skip_value(Gguf* g, uint32_t type) {
  static const uint8_t size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
  uint64_t n = 1, len;
  if (type == 9 && (!get(g, &type, 4) || !get(g, &n, 8) || type == 9)) return 0; /* array */
  for (uint64_t i = 0; type == 8 && i < n; ++i)
    if (!get(g, &len, 8) || !get(g, NULL, len)) return 0;
  return type == 8 || (type < 13 && n <= g->size / size[type] && get(g, NULL, n * size[type]));
}
static const TensorInfo* find(const Gguf* g, const char* name) {
  for (uint64_t i = 0; g->t && i < g->n_tensors; ++i)
    if (g->t[i].name_len == strlen(name) && !memcmp(g->t[i].name, name, g->t[i].name_len))
      return &g->t[i];
  return NULL;
}
/* Fills g->kv, g->t, g->data; refuses llama.* keys it does not read (rope scaling...). */
static ts_status parse(Gguf* g) {
  uint32_t magic = 0, version = 0, type = 0, u32;
  uint64_t n_kv = 0, len = 0;
  float f32;
  int llama = 0;
  REQUIRE(get(g, &magic, 4) && magic == 0x46554747 && get(g, &version, 4) && version >= 2 &&
              version <= 3 && get(g, &g->n_tensors, 8) && get(g, &n_kv, 8),
          TS_ERR_IO, "%s: not a GGUF v2/v3 file, or truncated header", g->path);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const int ok = get(g, &len, 8) && len <= g->size - g->pos,
              kl = ok ? (int)(len < 99 ? len : 99) : 0;
    const char* key = (const char*)g->buf + g->pos;
    const uint64_t at = g->pos + len + 4; /* where the value starts */
    REQUIRE(ok && get(g, NULL, len) && get(g, &type, 4) && skip_value(g, type), TS_ERR_IO,
            "%s: metadata key #%llu '%.*s': bad value type or truncated", g->path, i + 0ull, kl,
            key);
    const unsigned char* v = g->buf + at;
    int k = -1;
    for (int j = 0; j < N_KEYS; ++j)
      if (strlen(kKeys[j]) == len && !memcmp(key, kKeys[j], len)) k = j;
    if (len == 20 && !memcmp(key, "general.architecture", 20)) /* a string, "llama" */
      llama = type == 8 && at + 13 <= g->size && !memcmp(v, "\5\0\0\0\0\0\0\0llama", 13);
    if (k >= 0 && (type == 4 || type == 6)) /* UINT32 or FLOAT32 (as llama.cpp writes) */
      g->kv[k] = type == 4 ? (memcpy(&u32, v, 4), (double)u32) : (memcpy(&f32, v, 4), (double)f32);
    REQUIRE(k >= 0 ? type == 4 || type == 6 : len < 6 || memcmp(key, "llama.", 6),
            TS_ERR_UNSUPPORTED, "%s: metadata key '%.*s' not supported", g->path, kl, key);
  }
  REQUIRE(llama, TS_ERR_UNSUPPORTED, "%s: general.architecture is not \"llama\"", g->path);
  REQUIRE(g->n_tensors <= g->size / 24 && (g->t = calloc(g->n_tensors + 1, sizeof *g->t)),
          TS_ERR_IO, "%s: tensor count too large", g->path);
  for (uint64_t i = 0; i < g->n_tensors; ++i) {
    TensorInfo* t = &g->t[i];
    REQUIRE(get(g, &t->name_len, 8) && (t->name = (const char*)g->buf + g->pos) &&
                get(g, NULL, t->name_len) && get(g, &t->n_dims, 4) && t->n_dims <= 4 &&
                get(g, t->dims, 8 * t->n_dims) && get(g, &t->type, 4) && get(g, &t->offset, 8),
            TS_ERR_IO, "%s: tensor info #%llu: truncated", g->path, i + 0ull);
  }
  const double a = isnan(g->kv[K_ALIGN]) ? 32 : g->kv[K_ALIGN];
  REQUIRE(a >= 1 && a <= 1 << 30 && !((uint64_t)a & ((uint64_t)a - 1)), TS_ERR_IO,
          "%s: general.alignment %g is not a power of 2", g->path, a);
  g->data = (g->pos + (uint64_t)a - 1) / (uint64_t)a * (uint64_t)a;
  return TS_OK;
}
static float half(uint16_t h) { /* IEEE fp16 -> fp32, exact */
  const int e = (h >> 10) & 31, m = h & 1023;
  const float v =
      e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(e ? m | 1024 : m), (e ? e : 1) - 25);
  return (h & 0x8000) ? -v : v;
}
/* *out = tensor `name`, of ggml shape [ne0, ne1] (ne1 = 0: a vector), dequantized to fp32 with
 * ggml's dequantize_row_* formulas. */
static ts_status load(Gguf* g, const char* name, uint64_t ne0, uint64_t ne1, float** out) {
  const TensorInfo* t = find(g, name);
  REQUIRE(t, TS_ERR_IO, "%s: tensor %s not found", g->path, name);
  const int quant = t->type == Q4_1 || t->type == Q8_0;
  REQUIRE(t->type == F32 || (quant && ne0 % 32 == 0), TS_ERR_UNSUPPORTED,
          "%s: tensor %s: ggml type %u (F32, Q4_1, Q8_0 are read)", g->path, name, t->type);
  REQUIRE(t->n_dims == 1u + !!ne1 && t->dims[0] == ne0 && t->dims[1] == ne1, TS_ERR_IO,
          "%s: tensor %s: shape is not [%llu, %llu]", g->path, name, ne0 + 0ull, ne1 + 0ull);
  const uint64_t n = ne0 * (ne1 ? ne1 : 1), bs = t->type == Q4_1 ? 20 : 34; /* block bytes */
  const uint64_t bytes = quant ? n / 32 * bs : n * 4, room = g->size - g->data;
  REQUIRE(g->data <= g->size && t->offset <= room && bytes <= room - t->offset, TS_ERR_IO,
          "%s: tensor %s: data offset %llu + %llu bytes is past the end", g->path, name,
          t->offset + 0ull, bytes + 0ull);
  float* w = *out = malloc(n * sizeof(float));
  REQUIRE(w, TS_ERR_OUT_OF_MEMORY, "%s: tensor %s: out of memory", g->path, name);
  const unsigned char* q = g->buf + g->data + t->offset;
  if (!quant) memcpy(w, q, n * 4);
  for (uint64_t i = 0; quant && i < n; i += 32, q += bs) {
    uint16_t d, m;
    memcpy(&d, q, 2), memcpy(&m, q + 2, 2);
    for (int j = 0; t->type == Q4_1 && j < 16; ++j) { /* {fp16 d, fp16 m, 16 bytes of nibbles} */
      w[i + j] = (float)(q[4 + j] & 15) * half(d) + half(m);
      w[i + j + 16] = (float)(q[4 + j] >> 4) * half(d) + half(m);
    }
    for (int j = 0; t->type == Q8_0 && j < 32; ++j) w[i + j] = (float)(int8_t)q[2 + j] * half(d);
  }
  return TS_OK;
}
/* The model: weights of ggml shape [ne0 = inputs, ne1 = outputs], row o = output o. */
enum { ATTN_NORM, WQ, WK, WV, WO, FFN_NORM, GATE, UP, DOWN, N_W };
static const char* const kLayerTensors[N_W] = {"attn_norm", "attn_q",      "attn_k",
                                               "attn_v",    "attn_output", "ffn_norm",
                                               "ffn_gate",  "ffn_up",      "ffn_down"};
struct ts_model {
  int n_layer, n_ctx, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab;
  double rope_base, eps;
  float *tok_embd, *out_norm, *output; /* output == tok_embd when the LM head is tied */
  float* w[][N_W];                     /* w[layer][ATTN_NORM .. DOWN] */
};
static void free_model(ts_model* m) {
  for (int i = 0; m && i < m->n_layer * N_W; ++i) free(m->w[i / N_W][i % N_W]);
  if (m && m->output != m->tok_embd) free(m->output);
  if (m) free(m->tok_embd), free(m->out_norm), free(m);
}
/* The hyperparameters (checked) and the weights. */
static ts_status build(Gguf* g, ts_model** out) {
  double* kv = g->kv;
  if (isnan(kv[K_HKV])) kv[K_HKV] = kv[K_HEAD]; /* llama.cpp's defaults */
  if (isnan(kv[K_BASE])) kv[K_BASE] = 10000.0;
  for (int k = K_LAYER; k <= K_HKV; ++k) /* NaN (absent) fails too */
    REQUIRE(kv[k] >= 1 && kv[k] < 1 << 24, TS_ERR_IO, "%s: %s missing or out of range", g->path,
            kKeys[k]);
  const int n_layer = (int)kv[K_LAYER], d = (int)kv[K_EMBD], hd = d / (int)kv[K_HEAD];
  const TensorInfo* emb = find(g, "token_embd.weight");
  const int n_vocab = emb && emb->dims[1] < 1 << 30 ? (int)emb->dims[1] : 0;
  REQUIRE((int)kv[K_HEAD] % (int)kv[K_HKV] == 0 && d % (int)kv[K_HEAD] == 0 && hd % 2 == 0 &&
              kv[K_BASE] > 0 && kv[K_EPS] > 0 && n_vocab &&
              (isnan(kv[K_VOCAB]) || kv[K_VOCAB] == n_vocab),
          TS_ERR_IO, "%s: head counts, rope.freq_base, rms epsilon or vocabulary size out of range",
          g->path);
  for (int k = K_ROT; k <= K_VLEN; ++k) /* head dim n_embd / n_head, all of it rotated */
    REQUIRE(isnan(kv[k]) || kv[k] == hd, TS_ERR_UNSUPPORTED, "%s: %s %g != head dim %d", g->path,
            kKeys[k], kv[k], hd);
  const int tied = !find(g, "output.weight"); /* a plain Llama has exactly these tensors: */
  REQUIRE(g->n_tensors == 2u + !tied + N_W * (uint64_t)n_layer, TS_ERR_UNSUPPORTED,
          "%s: tensors other than a plain Llama's", g->path);
  ts_model* m = *out = calloc(1, sizeof *m + (size_t)n_layer * sizeof m->w[0]);
  REQUIRE(m, TS_ERR_OUT_OF_MEMORY, "%s: out of memory", g->path);
  m->n_layer = n_layer, m->n_ctx = (int)kv[K_CTX], m->n_embd = d, m->n_ff = (int)kv[K_FF];
  m->n_head = (int)kv[K_HEAD], m->n_head_kv = (int)kv[K_HKV], m->head_dim = hd;
  m->n_vocab = n_vocab, m->rope_base = kv[K_BASE], m->eps = kv[K_EPS];
  const uint64_t D = (uint64_t)d, kvd = (uint64_t)(m->n_head_kv * hd), ff = (uint64_t)m->n_ff,
                 V = (uint64_t)n_vocab;
  const uint64_t shape[N_W][2] = {{D, 0}, {D, D},  {D, kvd}, {D, kvd}, {D, D},
                                  {D, 0}, {D, ff}, {D, ff},  {ff, D}};
  ts_status st = load(g, "token_embd.weight", D, V, &m->tok_embd);
  if (!st) st = load(g, "output_norm.weight", D, 0, &m->out_norm);
  if (!st)
    st = tied ? (m->output = m->tok_embd, TS_OK) : load(g, "output.weight", D, V, &m->output);
  for (int i = 0; !st && i < n_layer * N_W; ++i) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", i / N_W, kLayerTensors[i % N_W]);
    st = load(g, name, shape[i % N_W][0], shape[i % N_W][1], &m->w[i / N_W][i % N_W]);
  }
  return st;
}
static ts_status load_model(const char* path, ts_model** out) {
  REQUIRE(path && out, TS_ERR_INVALID_ARGUMENT, "load_model: null argument");
  Gguf g = {.path = path};
  for (int k = 0; k < N_KEYS; ++k) g.kv[k] = NAN;
  FILE* f = fopen(path, "rb");
  const long n = f && !fseek(f, 0, SEEK_END) ? ftell(f) : 0;
  if (n > 0 && (g.buf = malloc((size_t)n)) && !fseek(f, 0, SEEK_SET))
    g.size = fread(g.buf, 1, (size_t)n, f) == (size_t)n ? (uint64_t)n : 0;
  if (f) fclose(f);
  ts_model* m = NULL;
  ts_status st = g.size ? parse(&g) : fail(TS_ERR_IO, "%s: cannot open or read the file", path);
  if (!st) st = build(&g, &m);
  free(g.buf), free(g.t);
  if (st) return free_model(m), st;
  return *out = m, TS_OK;
}
enum { CHUNK = 32 }; /* the forward pass: prefill reads the weights once per CHUNK tokens */
struct ts_session {
  const ts_model* m;
  int pos, max_ctx;
  float *k, *v; /* KV cache [n_layer][max_ctx][n_head_kv * head_dim] */
  float *x, *xn, *q, *att, *gate, *up, *scores; /* CHUNK rows each; scores: max_ctx */
};
static float dot(const float* a, const float* b, int n) { /* 8 independent fp32 partial sums */
  float s[8] = {0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}
/* Y[t][o] = W[o] . X[t] for n tokens; W has n_out rows of n_in (ggml shape [n_in, n_out]). */
static void matmul(const float* W, const float* X, float* Y, int n, int n_in, int n_out) {
  for (int o = 0; o < n_out; ++o)
    for (int t = 0; t < n; ++t)
      Y[(size_t)t * n_out + o] = dot(W + (size_t)o * n_in, X + t * n_in, n_in);
}
static void rms_norm(const float* x, const float* w, float* out, int n, double eps) {
  const float inv = 1.0f / sqrtf(dot(x, x, n) / (float)n + (float)eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}
/* Interleaved ("normal") RoPE: pairs (2i, 2i+1) of each head turn by pos * base^(-2i/hd). */
static void rope(float* x, int n_heads, int hd, int pos, double base) {
  for (int i = 0; i < hd / 2; ++i) {
    const double th = pos * pow(base, -2.0 * i / hd), c = cos(th), s = sin(th);
    for (float* v = x + 2 * i; v < x + n_heads * hd; v += hd) {
      const double x0 = v[0], x1 = v[1];
      v[0] = (float)(x0 * c - x1 * s), v[1] = (float)(x0 * s + x1 * c);
    }
  }
}
/* out = softmax_j(q . K[j] / sqrt(hd)) . V[j] over j < n; K, V rows `stride` floats apart. */
static void attend(const float* q, const float* K, const float* V, int n, int stride, int hd,
                   float* p, float* out) {
  float mx = -INFINITY, sum = 0;
  for (int j = 0; j < n; ++j)
    mx = fmaxf(mx, p[j] = dot(q, K + (size_t)j * stride, hd) / sqrtf((float)hd));
  for (int j = 0; j < n; ++j) sum += p[j] = expf(p[j] - mx);
  memset(out, 0, (size_t)hd * sizeof(float));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < hd; ++i) out[i] += p[j] * V[(size_t)j * stride + i];
  for (int i = 0; i < hd; ++i) out[i] /= sum;
}
/* Appends n <= CHUNK tokens; writes the logits of every row (all) or of the last (if logits). */
static void forward(ts_session* s, const int32_t* tokens, int n, float* logits, int all) {
  const ts_model* m = s->m;
  const int d = m->n_embd, hd = m->head_dim, kvd = m->n_head_kv * hd, ff = m->n_ff;
  for (int t = 0; t < n; ++t) memcpy(s->x + t * d, m->tok_embd + (size_t)tokens[t] * d, d * 4u);
  for (int l = 0; l < m->n_layer; ++l) {
    float* const* w = m->w[l];
    float* K = s->k + (size_t)l * s->max_ctx * kvd; /* this layer's cache at position 0 */
    float* V = s->v + (size_t)l * s->max_ctx * kvd;
    for (int t = 0; t < n; ++t) rms_norm(s->x + t * d, w[ATTN_NORM], s->xn + t * d, d, m->eps);
    matmul(w[WQ], s->xn, s->q, n, d, d);
    matmul(w[WK], s->xn, K + (size_t)s->pos * kvd, n, d, kvd); /* k, v straight to the cache */
    matmul(w[WV], s->xn, V + (size_t)s->pos * kvd, n, d, kvd);
    for (int t = 0; t < n; ++t) {
      rope(s->q + t * d, m->n_head, hd, s->pos + t, m->rope_base);
      rope(K + (size_t)(s->pos + t) * kvd, m->n_head_kv, hd, s->pos + t, m->rope_base);
    }
    /* Causal: token t sees positions 0 .. pos + t. GQA: query head h reads KV head h / group. */
    for (int t = 0, group = m->n_head / m->n_head_kv; t < n; ++t)
      for (int h = 0; h < m->n_head; ++h)
        attend(s->q + t * d + h * hd, K + h / group * hd, V + h / group * hd, s->pos + t + 1, kvd,
               hd, s->scores, s->att + t * d + h * hd);
    matmul(w[WO], s->att, s->xn, n, d, d);
    for (int i = 0; i < n * d; ++i) s->x[i] += s->xn[i];
    for (int t = 0; t < n; ++t) rms_norm(s->x + t * d, w[FFN_NORM], s->xn + t * d, d, m->eps);
    matmul(w[GATE], s->xn, s->gate, n, d, ff);
    matmul(w[UP], s->xn, s->up, n, d, ff);
    for (int i = 0; i < n * ff; ++i)
      s->gate[i] *= s->up[i] / (1.0f + expf(-s->gate[i])); /* SwiGLU */
    matmul(w[DOWN], s->gate, s->xn, n, ff, d);
    for (int i = 0; i < n * d; ++i) s->x[i] += s->xn[i];
  }
  s->pos += n;
  const int t0 = all ? 0 : n - 1; /* the rows whose logits are wanted */
  for (int t = t0; logits && t < n; ++t)
    rms_norm(s->x + t * d, m->out_norm, s->xn + t * d, d, m->eps);
  if (logits) matmul(m->output, s->xn + t0 * d, logits, n - t0, d, m->n_vocab);
}

static ts_status open_session(ts_model* m, const ts_session_options* o, ts_session** out) {
  REQUIRE(m && o && out && o->struct_size >= sizeof *o, TS_ERR_INVALID_ARGUMENT,
          "open_session: bad argument");
  *out = NULL; /* fault: test-only fault injection by name; this template implements none */
  REQUIRE(!o->fault || !o->fault[0], TS_ERR_UNSUPPORTED, "unknown fault '%s'", o->fault);
  REQUIRE(o->weight_path != TS_WEIGHTS_QUANTIZED, TS_ERR_UNSUPPORTED,
          "quantized weights: not implemented");
  REQUIRE(o->weight_path == TS_WEIGHTS_FULL_PRECISION && o->n_threads >= 0 && o->max_context >= 0,
          TS_ERR_INVALID_ARGUMENT, "open_session: bad weight_path, n_threads or max_context");
  const int ctx = o->max_context ? o->max_context : m->n_ctx, d = m->n_embd, ff = m->n_ff;
  const size_t kv = (size_t)m->n_layer * (size_t)ctx * (size_t)(m->n_head_kv * m->head_dim);
  ts_session* s = calloc(1, sizeof *s + (2 * kv + CHUNK * (4u * d + 2u * ff) + (size_t)ctx) * 4);
  REQUIRE(s, TS_ERR_OUT_OF_MEMORY, "open_session: out of memory"); /* one block: s, KV, scratch */
  s->m = m, s->max_ctx = ctx, s->k = (float*)(s + 1), s->v = s->k + kv, s->x = s->v + kv;
  s->xn = s->x + CHUNK * d, s->q = s->xn + CHUNK * d, s->att = s->q + CHUNK * d;
  s->gate = s->att + CHUNK * d, s->up = s->gate + CHUNK * ff, s->scores = s->up + CHUNK * ff;
  return *out = s, TS_OK;
}
static void free_session(ts_session* s) { free(s); }
static ts_status prefill(ts_session* s, const int32_t* tokens, int32_t n, int32_t all,
                         float* logits) {
  REQUIRE(s && tokens && logits && n > 0, TS_ERR_INVALID_ARGUMENT, "prefill: bad argument");
  for (int i = 0; i < n; ++i) /* check everything first: a refused call changes nothing */
    REQUIRE(tokens[i] >= 0 && tokens[i] < s->m->n_vocab, TS_ERR_INVALID_ARGUMENT,
            "token #%d = %d outside [0, %d)", i, tokens[i], s->m->n_vocab);
  REQUIRE(n <= s->max_ctx - s->pos, TS_ERR_CONTEXT_FULL, "%d + %d tokens > max context %d", s->pos,
          n, s->max_ctx);
  for (int i = 0, c; i < n; i += c) { /* CHUNK tokens at a time; logits of the last, or all */
    c = n - i < CHUNK ? n - i : CHUNK;
    float* out = all ? logits + (size_t)i * s->m->n_vocab : i + c == n ? logits : NULL;
    forward(s, tokens + i, c, out, all);
  }
  return TS_OK;
}
static ts_status decode(ts_session* s, int32_t t, float* out) { return prefill(s, &t, 1, 0, out); }
static ts_status rewind_to(ts_session* s, int32_t position) { /* later tokens overwrite the KV */
  REQUIRE(s && position >= 0 && position <= s->pos, TS_ERR_INVALID_ARGUMENT,
          "rewind to %d outside [0, %d]", position, s ? s->pos : 0);
  return s->pos = position, TS_OK;
}
static int32_t position(const ts_session* s) { return s ? s->pos : 0; }
static int32_t n_vocab(const ts_model* m) { return m ? m->n_vocab : 0; }
static const char* device_name(void) { return "CPU (scalar C template, 1 thread)"; }
static ts_status capabilities(ts_capabilities* c) {
  REQUIRE(c && c->struct_size >= sizeof *c, TS_ERR_INVALID_ARGUMENT, "capabilities: bad argument");
  memset(c, 0, sizeof *c), c->struct_size = sizeof *c;
  c->flags = TS_CAP_ALL_POSITION_LOGITS | TS_CAP_BITWISE_DETERMINISM;
  c->weight_types = TS_WEIGHT_TYPE_BIT(F32) | TS_WEIGHT_TYPE_BIT(Q4_1) | TS_WEIGHT_TYPE_BIT(Q8_0);
  return TS_OK;
}
/* The table (ABI v4). Optional members left NULL: prefill_greedy, set_taps, read_taps. */
static const ts_backend kBackend = {
    .api_version = TS_BACKEND_API_VERSION,
    .name = "template_c",
    .version = "0.1.0",
    .last_error = last_error,
    .device_name = device_name,
    .capabilities = capabilities,
    .load_model = load_model,
    .free_model = free_model,
    .n_vocab = n_vocab,
    .open_session = open_session,
    .free_session = free_session,
    .prefill = prefill,
    .decode = decode,
    .rewind = rewind_to,
    .position = position,
    .architectures = "llama", /* computes plain Llama models only (ABI v3) */
    .model_features = "",     /* no feature beyond them (docs/model-families.md) */
};
__attribute__((visibility("default"))) const ts_backend* touchstone_backend_entry(void) {
  return &kBackend;
}
