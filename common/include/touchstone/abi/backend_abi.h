/* touchstone/abi/backend_abi.h - THE SESSION CONTRACT. Read this first.
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

#define TS_BACKEND_API_VERSION 9
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
/* A token's bits do not depend on the other tokens of its call (batch, chunk, fork);
 * for the paths in batch_invariant_paths. */
#define TS_CAP_BATCH_INVARIANT (1u << 7)
/* With TS_CAP_BITWISE_DETERMINISM: the bitwise claim stops at fork_session. */
#define TS_CAP_BITWISE_NOT_ACROSS_FORKS (1u << 8)
/* ---- api_version >= 7 [structured output] ---- */
/* The session enforces a grammar itself: set_grammar, grammar_mask, grammar_greedy. */
#define TS_CAP_STRUCTURED_OUTPUT (1u << 9)
/* ---- api_version >= 8 [multimodal] ---- */
/* prefill_embeddings: caller-supplied input embeddings (an image's tokens) at the session's
 * positions, attended causally or as one bidirectional block. */
#define TS_CAP_EMBEDDING_INPUT (1u << 10)
/* load_vision + encode_image: the backend runs a vision tower and projector itself. */
#define TS_CAP_MULTIMODAL (1u << 11)

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
  uint32_t batch_invariant_paths; /* bit (1u << ts_weight_path) per path; 0 = every path */
  int32_t max_batch;              /* most entries per step_batch; 0 = no limit */
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

/* Layer taps (api_version >= 4): per layer, TS_TAP_POINTS vectors of n_embd float32,
 * in this order (what each holds: docs/contract.md, "Version 4: layer taps"). */
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

/* A grammar handed to a session (api_version >= 7). */
typedef enum ts_grammar_kind {
  TS_GRAMMAR_JSON_SCHEMA = 0, /* a JSON Schema (draft 2020-12 subset), no extra properties */
  TS_GRAMMAR_GBNF = 1,        /* llama.cpp GBNF, root rule "root" */
  TS_GRAMMAR_REGEX = 2        /* a regular expression the whole output matches */
} ts_grammar_kind;

typedef struct ts_grammar {
  uint32_t struct_size; /* sizeof(ts_grammar), set by the caller */
  ts_grammar_kind kind;
  const char* text; /* NUL-terminated UTF-8 */
} ts_grammar;

/* Input embeddings for prefill_embeddings (api_version >= 8). */
typedef struct ts_embedding_input {
  uint32_t struct_size;    /* sizeof(ts_embedding_input), set by the caller */
  const float* embeddings; /* n_tokens x n_embd float32, row-major, used as given (no
                              embedding scale: they replace the token embedding's output) */
  int32_t n_tokens;        /* >= 1 */
  int32_t n_embd;          /* must equal the model's embedding width */
  int32_t bidirectional;   /* != 0: the n_tokens also attend to each other's later rows
                              (Gemma 3's image block); 0: causally, as n tokens would */
} ts_embedding_input;

/* An image for encode_image (api_version >= 8), in one of two forms. */
typedef enum ts_image_format {
  /* the pixel tensor the model's processor produces (resized, rescaled, normalised):
   * float32 [channels][height][width], the tower's input size */
  TS_IMAGE_PIXELS_F32 = 0,
  /* the decoded image before any processing (alpha composited over white): uint8
   * [height][width][channels], any size; the backend preprocesses it itself */
  TS_IMAGE_RGB8 = 1
} ts_image_format;

typedef struct ts_image {
  uint32_t struct_size; /* sizeof(ts_image), set by the caller */
  ts_image_format format;
  const void* data; /* as format says */
  int32_t channels; /* 3 (RGB) */
  int32_t height;   /* pixels */
  int32_t width;
} ts_image;

/* The shape of the pixel tensor preprocess_image writes (api_version >= 9). */
typedef struct ts_pixel_shape {
  uint32_t struct_size; /* sizeof(ts_pixel_shape), set by the caller */
  int32_t n_frames;     /* frames in prompt order (Idefics3: its tiles, then the global view;
                           1 for a family that does not tile) */
  int32_t channels;     /* each frame's: 3 */
  int32_t height;       /* pixels, the tower's input size */
  int32_t width;
} ts_pixel_shape;

/* Options of the vision path attached by load_vision (api_version >= 9). */
typedef struct ts_vision_options {
  uint32_t struct_size; /* sizeof(ts_vision_options), set by the caller */
  const char* fault;    /* test-only fault injection name for the preprocessing, tower and
                           projector (touchstone/model/faults.h), NULL = none */
} ts_vision_options;

/* Allowed-token masks (grammar_mask): ceil(n_vocab / 32) uint32 words; token i is
 * allowed iff bit (i % 32) of word (i / 32) is set. */
#define TS_MASK_WORDS(n_vocab) (((n_vocab) + 31) / 32)

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
  /* TS_CAP_DEVICE_GREEDY (else NULL): prefill, then *token_out = argmax of the last
   * position (lowest id among equal maxima, NaN never wins), computed on the device. */
  ts_status (*prefill_greedy)(ts_session* session, const int32_t* tokens, int32_t n_tokens,
                              int32_t* token_out);

  /* ---- api_version >= 3 ---- */
  const char* architectures;  /* comma-separated general.architecture values; NULL = not declared */
  const char* model_features; /* comma-separated feature names; "" = none, "*" = all */

  /* ---- api_version >= 4 ---- (both NULL or both set) */
  /* enable != 0: record the last position's taps of each later call; logits unchanged. */
  ts_status (*set_taps)(ts_session* session, int32_t enable);
  /* out: [n_layer][TS_TAP_POINTS][n_embd] float32; n_floats must equal that size. */
  ts_status (*read_taps)(ts_session* session, float* out, int64_t n_floats);

  /* ---- api_version >= 6 [serving] ---- (NULL = not implemented) */
  /* Each entry appends as prefill would; on error no session moves and last_error
   * names the entry (errors: docs/contract.md, "Version 6: serving"). */
  ts_status (*step_batch)(const ts_batch_entry* entries, int32_t n_entries);
  /* *out: a new session holding src's first n_prefix (<= position(src)) positions. */
  ts_status (*fork_session)(ts_session* src, int32_t n_prefix, ts_session** out);

  /* ---- api_version >= 7 [structured output] ---- (all three NULL or all set, with
   * TS_CAP_STRUCTURED_OUTPUT; rules: docs/contract.md, "Version 7: structured output") */
  /* From position() on, every token appended (prefill, decode, step_batch) must keep the
   * text a prefix of a sentence of the grammar, or the call fails with
   * TS_ERR_INVALID_ARGUMENT and nothing moves. A stop token (EOS, end-of-turn) is allowed
   * only where the sentence may end, and nothing after it. rewind and fork_session carry
   * the grammar's state back to their position. grammar NULL removes it. */
  ts_status (*set_grammar)(ts_session* session, const ts_grammar* grammar);
  /* The allowed set at position() (n_words == TS_MASK_WORDS(n_vocab)). */
  ts_status (*grammar_mask)(ts_session* session, uint32_t* mask_out, int32_t n_words);
  /* The backend's constrained greedy picks for the last n_positions positions of the last
   * call on the session: tokens_out[i] = argmax over the set allowed after that position
   * (lowest id on ties), or -1 where nothing is allowed. n_positions > 1 needs that call to
   * have returned all positions. Appends nothing. */
  ts_status (*grammar_greedy)(ts_session* session, int32_t n_positions, int32_t* tokens_out);

  /* ---- api_version >= 8 [multimodal] ---- (rules: docs/contract.md, "Version 8: multimodal") */
  /* TS_CAP_EMBEDDING_INPUT (else NULL): appends input->n_tokens positions whose input is
   * the given embeddings instead of token ids, as prefill would (logits_out: n_vocab floats,
   * or n_tokens * n_vocab when all_positions). Fails with TS_ERR_INVALID_ARGUMENT while a
   * grammar is set (grammars constrain tokens) and when n_embd is not the model's. */
  ts_status (*prefill_embeddings)(ts_session* session, const ts_embedding_input* input,
                                  int32_t all_positions, float* logits_out);
  /* TS_CAP_MULTIMODAL (else both NULL): attaches the vision tower and projector of a
   * llama.cpp mmproj GGUF to the model (its projection width must be the model's n_embd);
   * then encode_image writes the image's projected embeddings, n_image_tokens x n_embd
   * float32 (n_floats must equal that size; the error names it). A format the backend
   * does not take is TS_ERR_UNSUPPORTED (the harness then offers the other). */
  ts_status (*load_vision)(ts_model* model, const char* mmproj_path);
  ts_status (*encode_image)(ts_model* model, const ts_image* image, float* embeddings_out,
                            int64_t n_floats);

  /* ---- api_version >= 9 [multimodal preprocessing] ---- (each NULL = not implemented;
   * both need TS_CAP_MULTIMODAL and a load_vision first; rules: docs/contract.md,
   * "Version 9: preprocessing") */
  /* The backend's own preprocessing of a decoded image (image->format TS_IMAGE_RGB8): the
   * pixel tensor encode_image would hand its tower for that image, every frame in order,
   * float32 [n_frames][channels][height][width]. On TS_OK *shape_out is set; pixels_out
   * NULL asks for the shape only, else n_floats must equal the tensor's size
   * (TS_ERR_INVALID_ARGUMENT naming both). */
  ts_status (*preprocess_image)(ts_model* model, const ts_image* image, ts_pixel_shape* shape_out,
                                float* pixels_out, int64_t n_floats);
  /* Options for the vision path attached to the model (options NULL: the defaults). A fault
   * the backend does not implement is TS_ERR_UNSUPPORTED. */
  ts_status (*set_vision_options)(ts_model* model, const ts_vision_options* options);
} ts_backend;

/* The one exported symbol. */
typedef const ts_backend* (*ts_backend_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TOUCHSTONE_BACKEND_ABI_H */
