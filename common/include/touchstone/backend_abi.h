/* touchstone/backend_abi.h - THE SESSION CONTRACT. Read this first.
 *
 * A backend is a shared library (libtouchstone_backend_<name>.so) that exports
 * one C symbol, `touchstone_backend_entry`, returning a table of function
 * pointers. The harness dlopen()s the library by name or by path, checks
 * `api_version`, and drives the token loop through a session:
 *
 *    model   = load_model(gguf_path)            weights, in the backend's own layout
 *    session = open_session(model, options)     owns its KV cache
 *    prefill(tokens[n])  -> logits [n_vocab] of the last position
 *                           (or [n, n_vocab], row-major, when all_positions != 0)
 *    decode(token)       -> logits [n_vocab] of the new position
 *    rewind(p)           -> drop KV entries at positions >= p (KV truncation)
 *    position()          -> number of tokens in the KV cache
 *
 * Units and dtypes: token ids are int32 in [0, n_vocab); logits are float32
 * raw (pre-softmax) values, natural-log scale; positions count tokens from 0.
 * The caller owns every output buffer; the backend never allocates memory the
 * caller must free (except through the *_free functions).
 *
 * Errors: every function returns a ts_status. On anything but TS_OK the
 * backend's last_error() returns a human-readable message (thread-local, valid
 * until the next call on that thread). No C++ exception may cross this ABI.
 *
 * Versioning (after ggml's ggml-backend-reg): members are only ever appended
 * to ts_backend. A loader accepts api_version 1 .. TS_BACKEND_API_VERSION and
 * reads a member added in version N only when api_version >= N (a version-1
 * table ends at `position`); it refuses any other number and names both.
 * Structs passed in carry struct_size so fields can be appended later.
 *
 * Each member's full rule (shapes, units, errors) and what each version
 * appended: docs/contract.md.
 */
#ifndef TOUCHSTONE_BACKEND_ABI_H
#define TOUCHSTONE_BACKEND_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_BACKEND_API_VERSION 6
#define TS_BACKEND_ENTRY_SYMBOL "touchstone_backend_entry"

typedef enum ts_status {
  TS_OK = 0,
  TS_ERR_INVALID_ARGUMENT = 1, /* bad token id, bad position, bad option */
  TS_ERR_UNSUPPORTED = 2,      /* weight type / option / feature not supported */
  TS_ERR_IO = 3,               /* model file unreadable or malformed */
  TS_ERR_OUT_OF_MEMORY = 4,
  TS_ERR_CONTEXT_FULL = 5, /* position would exceed the session's max context */
  TS_ERR_DEVICE = 6,       /* no usable device / device call failed */
  TS_ERR_INTERNAL = 7
} ts_status;

/* Capability flags (ts_capabilities.flags). */
#define TS_CAP_ALL_POSITION_LOGITS (1u << 0) /* prefill can return logits of every position */
#define TS_CAP_DEVICE_GREEDY (1u << 1)       /* greedy argmax computed on the device      */
#define TS_CAP_BATCHED_SESSIONS (1u << 2)    /* v6: step_batch is one forward pass        */
#define TS_CAP_KV_PREFIX_COPY (1u << 3)      /* v6: fork_session copies a KV prefix        */
#define TS_CAP_BITWISE_DETERMINISM (1u << 4) /* same inputs -> same bits, any thread count */
#define TS_CAP_STATIC_SHAPES (1u << 5)       /* prefill runs in fixed shape buckets       */
/* ---- api_version >= 5 [http / top-N logprobs] ---- */
#define TS_CAP_TOP_N_LOGPROBS (1u << 6) /* rows hold top_n log-probs, -INFINITY elsewhere */
/* ---- api_version >= 6 [serving] ---- */
/* A token's logits and KV entries are bitwise independent of every other token
 * computed in the same call: other entries of a step_batch (their number,
 * lengths, positions and contents) and the other tokens of its own prefill
 * chunk. So a sequence gives the same bits alone, in any batch, chunked any way
 * and after a fork. Which weight paths the claim covers: batch_invariant_paths. */
#define TS_CAP_BATCH_INVARIANT (1u << 7)
/* With TS_CAP_BITWISE_DETERMINISM: the claim stops at fork_session. A fork, and
 * its source after the fork, may give other bits than a fresh session fed the
 * same tokens in the same calls (e.g. llama.cpp: a fork shares its source's KV
 * cells, so its later tokens sit in other cells and attention sums them in
 * another order). The serving checks then judge forks with the profile; every
 * other comparison stays bitwise. Ignored without TS_CAP_BITWISE_DETERMINISM or
 * with TS_CAP_BATCH_INVARIANT for the path (that claim covers forks). */
#define TS_CAP_BITWISE_NOT_ACROSS_FORKS (1u << 8)

/* Weight-type bits (ts_capabilities.weight_types): bit i = GGUF ggml_type i
 * (F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q6_K = 14, BF16 = 30). */
#define TS_WEIGHT_TYPE_BIT(ggml_type) (1ull << (ggml_type))

typedef struct ts_capabilities {
  uint32_t struct_size;         /* sizeof(ts_capabilities), set by the caller */
  uint32_t flags;               /* TS_CAP_* */
  uint64_t weight_types;        /* TS_WEIGHT_TYPE_BIT(...) of GGUF types it consumes */
  int32_t max_context;          /* tokens; 0 = limited only by the model */
  int32_t n_shape_buckets;      /* number of valid entries in shape_buckets */
  int32_t shape_buckets[16];    /* static prefill lengths, ascending */
  const char* determinism_note; /* why not deterministic, or NULL */
  /* ---- api_version >= 5 [http / top-N logprobs]; read only when the filled
   * struct_size covers it ---- */
  int32_t top_n; /* TS_CAP_TOP_N_LOGPROBS: finite entries per row (at most); else 0 */
  /* ---- api_version >= 6 [serving]; read only when the filled struct_size
   * covers it ---- */
  /* TS_CAP_BATCH_INVARIANT: bit (1u << ts_weight_path) for each weight path the
   * claim covers; 0 with the flag set = every path. Ignored without the flag. */
  uint32_t batch_invariant_paths;
  /* Most entries one step_batch call accepts (more: TS_ERR_INVALID_ARGUMENT);
   * 0 = no limit beyond memory. */
  int32_t max_batch;
} ts_capabilities;

/* The size of a version 1-4 ts_capabilities (everything before top_n). */
#define TS_CAPABILITIES_V4_SIZE (offsetof(ts_capabilities, top_n))
/* The size of a version 5 ts_capabilities (everything before batch_invariant_paths). */
#define TS_CAPABILITIES_V5_SIZE (offsetof(ts_capabilities, batch_invariant_paths))

/* Which weights the session computes with. */
typedef enum ts_weight_path {
  TS_WEIGHTS_FULL_PRECISION = 0, /* every weight dequantized to fp32 at load */
  TS_WEIGHTS_QUANTIZED = 1       /* weights stay in their GGUF block format  */
} ts_weight_path;

typedef struct ts_session_options {
  uint32_t struct_size; /* sizeof(ts_session_options), set by the caller */
  ts_weight_path weight_path;
  int32_t n_threads;   /* 0 = backend default (number of cores) */
  int32_t max_context; /* 0 = model's context_length */
  const char* fault;   /* test-only fault injection name, NULL = none;
                          a backend that does not know it returns
                          TS_ERR_UNSUPPORTED */
} ts_session_options;

/* Layer taps (api_version >= 4): per layer, TS_TAP_POINTS vectors of n_embd
 * float32, in this order. The attention and FFN outputs are the values added to
 * the residual stream (after the output projection and any post-norm, before
 * the add); the residual is the stream after the layer's last add. */
#define TS_TAP_ATTN_OUT 0
#define TS_TAP_FFN_OUT 1
#define TS_TAP_RESIDUAL 2
#define TS_TAP_POINTS 3

typedef struct ts_model ts_model;     /* opaque, backend-defined */
typedef struct ts_session ts_session; /* opaque, backend-defined */

/* One sequence's share of a step_batch call (api_version >= 6). */
typedef struct ts_batch_entry {
  uint32_t struct_size;  /* sizeof(ts_batch_entry), the same in every entry: the
                            array's stride (fields may be appended later) */
  ts_session* session;   /* distinct in every entry of one call */
  const int32_t* tokens; /* n_tokens token ids in [0, n_vocab) */
  int32_t n_tokens;      /* >= 1; 1 = a decode step, more = a prefill chunk */
  int32_t all_positions; /* != 0: logits of every token (TS_CAP_ALL_POSITION_LOGITS) */
  float* logits_out;     /* n_vocab floats, or n_tokens * n_vocab when all_positions;
                            buffers of different entries must not overlap */
} ts_batch_entry;

typedef struct ts_backend {
  uint32_t api_version; /* == TS_BACKEND_API_VERSION */
  const char* name;     /* "reference", "cpu_simd", ... */
  const char* version;  /* backend's own version string */

  const char* (*last_error)(void);
  /* Human-readable device description ("CPU: AMD EPYC ...", "Vulkan: llvmpipe"). */
  const char* (*device_name)(void);
  ts_status (*capabilities)(ts_capabilities* out);

  ts_status (*load_model)(const char* gguf_path, ts_model** out);
  void (*free_model)(ts_model* model);
  int32_t (*n_vocab)(const ts_model* model);

  ts_status (*open_session)(ts_model* model, const ts_session_options* options, ts_session** out);
  void (*free_session)(ts_session* session);

  /* Append n_tokens at the current position. logits_out holds n_vocab floats,
   * or n_tokens * n_vocab when all_positions != 0 (needs TS_CAP_ALL_POSITION_LOGITS). */
  ts_status (*prefill)(ts_session* session, const int32_t* tokens, int32_t n_tokens,
                       int32_t all_positions, float* logits_out);
  /* Append one token; logits_out holds n_vocab floats. */
  ts_status (*decode)(ts_session* session, int32_t token, float* logits_out);
  /* Truncate the KV cache to `position` tokens (0 <= position <= position()). */
  ts_status (*rewind)(ts_session* session, int32_t position);
  int32_t (*position)(const ts_session* session);

  /* ---- api_version >= 2 ---- */
  /* Greedy step, for backends with TS_CAP_DEVICE_GREEDY (NULL otherwise):
   * append n_tokens exactly as prefill does (n_tokens == 1 is a decode step) and
   * write to *token_out the argmax of the last position's logits, the lowest
   * token id among equal maxima (NaN never wins), computed where the logits
   * are: no n_vocab-sized buffer crosses to the caller. */
  ts_status (*prefill_greedy)(ts_session* session, const int32_t* tokens, int32_t n_tokens,
                              int32_t* token_out);

  /* ---- api_version >= 3 ---- */
  /* What the backend computes, declared before any load (docs/model-families.md).
   * architectures: comma-separated GGUF general.architecture values it loads,
   * e.g. "llama" or "llama,qwen2,qwen3,gemma3,phi3".
   * model_features: comma-separated feature names it computes beyond a plain
   * Llama ("neox_rope,qk_norm,geglu,..."; "" = none; "*" = all).
   * The harness reads the model's config first and reports a model that needs an
   * architecture or feature outside these lists as UNSUPPORTED, naming what is
   * missing, without calling load_model. NULL = not declared: load_model decides
   * (and must still refuse what it cannot compute with TS_ERR_UNSUPPORTED). */
  const char* architectures;
  const char* model_features;

  /* ---- api_version >= 4 ---- */
  /* Layer taps (optional: both NULL when not implemented). After
   * set_taps(session, 1), every prefill / decode / prefill_greedy call records
   * the activations of the LAST position it processed; read_taps copies the
   * latest record into out: n_layer * TS_TAP_POINTS * n_embd float32,
   * out[(layer * TS_TAP_POINTS + point) * n_embd + i] (n_layer = GGUF
   * <arch>.block_count, n_embd = <arch>.embedding_length). n_floats must equal
   * that size (TS_ERR_INVALID_ARGUMENT otherwise, naming both); read_taps before
   * any recorded call, or with taps off, is TS_ERR_INVALID_ARGUMENT.
   * set_taps(session, 0) stops recording. Recording must not change logits. */
  ts_status (*set_taps)(ts_session* session, int32_t enable);
  ts_status (*read_taps)(ts_session* session, float* out, int64_t n_floats);

  /* ---- api_version >= 6 [serving] (docs/serving-checks.md) ---- */
  /* Advances n_entries sessions (1 <= n_entries <= max_batch when max_batch > 0):
   * entry i appends its tokens at its session's position exactly as
   * prefill(session, tokens, n_tokens, all_positions, logits_out) would, and
   * must give the same result within the backend's own numerics (bitwise, when
   * it claims TS_CAP_BATCH_INVARIANT). Sequences may differ in length and
   * position, prefill chunks and decode steps mixed. A backend that sets
   * TS_CAP_BATCHED_SESSIONS computes them in one forward pass (each weight
   * matrix read once for every entry's tokens); one that loops leaves it clear.
   * Errors (no session changes position; last_error names the entry index):
   * TS_ERR_INVALID_ARGUMENT for n_entries < 1 or over max_batch, a NULL or
   * repeated session, sessions of different models or weight paths, a wrong
   * struct_size, a bad token, a NULL buffer or all_positions without
   * TS_CAP_ALL_POSITION_LOGITS; TS_ERR_CONTEXT_FULL for an entry with no room.
   * NULL: not implemented (the harness runs the entries one prefill at a time
   * and reports batching as emulated). */
  ts_status (*step_batch)(const ts_batch_entry* entries, int32_t n_entries);
  /* A new session with src's options (weight path, threads, max_context, fault)
   * whose KV cache holds src's first n_prefix positions (0 <= n_prefix <=
   * position(src), else TS_ERR_INVALID_ARGUMENT): copied or shared copy-on-write,
   * the backend's choice. position(*out) == n_prefix; src is unchanged and stays
   * usable; the two sessions are independent from then on (either may be
   * rewound, advanced or freed first). Taps start off. Free *out with
   * free_session. NULL: not implemented (TS_CAP_KV_PREFIX_COPY clear). */
  ts_status (*fork_session)(ts_session* src, int32_t n_prefix, ts_session** out);
} ts_backend;

/* The one exported symbol. */
typedef const ts_backend* (*ts_backend_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TOUCHSTONE_BACKEND_ABI_H */
