/* A minimal backend used to test the loader: built several times with
 * FAKE_API_VERSION / FAKE_NULL_ENTRY / FAKE_MISSING_FN / FAKE_CLAIMS_GREEDY /
 * FAKE_GREEDY_FN / FAKE_V4_CAPS / FAKE_V5_CAPS / FAKE_CLAIMS_BATCHED /
 * FAKE_CLAIMS_FORK / FAKE_CLAIMS_GRAMMAR / FAKE_CLAIMS_MULTIMODAL / FAKE_PREPROCESS_ORPHAN to
 * exercise every refusal path of BackendLibrary::load and the version-1 compatibility rule. Every
 * session call fails loudly. */
#include <stddef.h>
#include <stdlib.h>

#include "touchstone/abi/backend_abi.h"

#ifndef FAKE_API_VERSION
#define FAKE_API_VERSION TS_BACKEND_API_VERSION
#endif

static const char* last_error(void) { return "fake backend: nothing is implemented"; }
static const char* device_name(void) { return "fake device"; }
static ts_status capabilities(ts_capabilities* c) {
#ifdef FAKE_V4_CAPS
  /* Built against the version-4 header: knows only the v4 struct (refuses any
   * other size, as a strict backend may) and, claiming bit 6 (meaningless in
   * v4), must not be taken for a top-N backend. */
  if (!c || c->struct_size != TS_CAPABILITIES_V4_SIZE) return TS_ERR_INVALID_ARGUMENT;
  c->flags = TS_CAP_TOP_N_LOGPROBS;
#elif defined(FAKE_V5_CAPS)
  /* Built against the version-5 header: knows the struct up to top_n, and sets
   * bits 2, 3 and 7, which meant something looser (or nothing) before ABI v6:
   * the harness must not read them as step_batch / fork_session claims. */
  if (!c || c->struct_size != TS_CAPABILITIES_V5_SIZE) return TS_ERR_INVALID_ARGUMENT;
  c->flags = TS_CAP_BATCHED_SESSIONS | TS_CAP_KV_PREFIX_COPY | TS_CAP_BATCH_INVARIANT;
  c->top_n = 0;
#else
  if (!c || c->struct_size < sizeof(*c)) return TS_ERR_INVALID_ARGUMENT;
#ifdef FAKE_CLAIMS_GREEDY
  c->flags = TS_CAP_DEVICE_GREEDY;
#else
  c->flags = 0;
#endif
#ifdef FAKE_TOP_N
  c->flags |= TS_CAP_TOP_N_LOGPROBS;
  c->top_n = FAKE_TOP_N;
#endif
#ifdef FAKE_CLAIMS_BATCHED
  c->flags |= TS_CAP_BATCHED_SESSIONS;
#endif
#ifdef FAKE_CLAIMS_FORK
  c->flags |= TS_CAP_KV_PREFIX_COPY;
#endif
#ifdef FAKE_CLAIMS_GRAMMAR
  c->flags |= TS_CAP_STRUCTURED_OUTPUT;
#endif
#ifdef FAKE_CLAIMS_MULTIMODAL
  c->flags |= TS_CAP_EMBEDDING_INPUT | TS_CAP_MULTIMODAL;
#endif
#endif
  c->weight_types = TS_WEIGHT_TYPE_BIT(0);
  c->max_context = 0;
  c->n_shape_buckets = 0;
  c->determinism_note = "fake";
  return TS_OK;
}
static ts_status load_model(const char* p, ts_model** m) {
  (void)p;
  (void)m;
  return TS_ERR_DEVICE;
}
static void free_model(ts_model* m) { (void)m; }
static int32_t n_vocab(const ts_model* m) {
  (void)m;
  return 0;
}
static ts_status open_session(ts_model* m, const ts_session_options* o, ts_session** s) {
  (void)m;
  (void)o;
  (void)s;
  return TS_ERR_UNSUPPORTED;
}
static void free_session(ts_session* s) { (void)s; }
static ts_status prefill(ts_session* s, const int32_t* t, int32_t n, int32_t a, float* l) {
  (void)s;
  (void)t;
  (void)n;
  (void)a;
  (void)l;
  return TS_ERR_UNSUPPORTED;
}
static ts_status decode(ts_session* s, int32_t t, float* l) {
  (void)s;
  (void)t;
  (void)l;
  return TS_ERR_UNSUPPORTED;
}
static ts_status rewind_to(ts_session* s, int32_t p) {
  (void)s;
  (void)p;
  return TS_ERR_UNSUPPORTED;
}
static int32_t position(const ts_session* s) {
  (void)s;
  return 0;
}

/* Present in the table but must never be called by a loader when the table
 * says api_version 1 (a real version-1 table ends before this member). */
static ts_status prefill_greedy(ts_session* s, const int32_t* t, int32_t n, int32_t* out) {
  (void)s;
  (void)t;
  (void)n;
  (void)out;
  return TS_ERR_INTERNAL;
}
#ifdef FAKE_GREEDY_FN
#define FAKE_GREEDY prefill_greedy
#else
#define FAKE_GREEDY NULL
#endif

/* Version 3 members; a version-2 table (FAKE_API_VERSION=2) carries garbage here
 * that the loader must not read. */
#if FAKE_API_VERSION == 2
#define FAKE_ARCHITECTURES "garbage: a version-2 table ends before this member"
#define FAKE_FEATURES "garbage"
#else
#define FAKE_ARCHITECTURES "llama"
#define FAKE_FEATURES ""
#endif

/* Version 4 members; an older table carries entries here that a loader must
 * neither read nor call (they abort). */
static ts_status set_taps_trap(ts_session* s, int32_t enable) {
  (void)s;
  (void)enable;
  abort();
}
static ts_status read_taps_trap(ts_session* s, float* out, int64_t n) {
  (void)s;
  (void)out;
  (void)n;
  abort();
}
#if FAKE_API_VERSION < 4
#define FAKE_SET_TAPS set_taps_trap
#define FAKE_READ_TAPS read_taps_trap
#elif defined(FAKE_TAPS_HALF)
#define FAKE_SET_TAPS set_taps_trap
#define FAKE_READ_TAPS NULL
#else
#define FAKE_SET_TAPS NULL
#define FAKE_READ_TAPS NULL
#endif

/* Version 6 members; an older table carries entries here that a loader must
 * neither read nor call (they abort). A version-6 table leaves them NULL. */
static ts_status step_batch_trap(const ts_batch_entry* e, int32_t n) {
  (void)e;
  (void)n;
  abort();
}
static ts_status fork_session_trap(ts_session* src, int32_t n, ts_session** out) {
  (void)src;
  (void)n;
  (void)out;
  abort();
}
#if FAKE_API_VERSION < 6
#define FAKE_STEP_BATCH step_batch_trap
#define FAKE_FORK fork_session_trap
#else
#define FAKE_STEP_BATCH NULL
#define FAKE_FORK NULL
#endif

/* Version 7 members; an older table carries entries here that a loader must
 * neither read nor call (they abort). A version-7 table leaves them NULL. */
static ts_status set_grammar_trap(ts_session* s, const ts_grammar* g) {
  (void)s;
  (void)g;
  abort();
}
static ts_status grammar_mask_trap(ts_session* s, uint32_t* m, int32_t n) {
  (void)s;
  (void)m;
  (void)n;
  abort();
}
static ts_status grammar_greedy_trap(ts_session* s, int32_t n, int32_t* t) {
  (void)s;
  (void)n;
  (void)t;
  abort();
}
#if FAKE_API_VERSION < 7
#define FAKE_SET_GRAMMAR set_grammar_trap
#define FAKE_GRAMMAR_MASK grammar_mask_trap
#define FAKE_GRAMMAR_GREEDY grammar_greedy_trap
#else
#define FAKE_SET_GRAMMAR NULL
#define FAKE_GRAMMAR_MASK NULL
#define FAKE_GRAMMAR_GREEDY NULL
#endif

/* Version 8 members; an older table carries entries here that a loader must
 * neither read nor call (they abort). A version-8 table leaves them NULL. */
static ts_status prefill_embeddings_trap(ts_session* s, const ts_embedding_input* in, int32_t a,
                                         float* out) {
  (void)s;
  (void)in;
  (void)a;
  (void)out;
  abort();
}
static ts_status load_vision_trap(ts_model* m, const char* p) {
  (void)m;
  (void)p;
  abort();
}
static ts_status encode_image_trap(ts_model* m, const ts_image* i, float* out, int64_t n) {
  (void)m;
  (void)i;
  (void)out;
  (void)n;
  abort();
}
#if FAKE_API_VERSION < 8
#define FAKE_PREFILL_EMBEDDINGS prefill_embeddings_trap
#define FAKE_LOAD_VISION load_vision_trap
#define FAKE_ENCODE_IMAGE encode_image_trap
#else
#define FAKE_PREFILL_EMBEDDINGS NULL
#define FAKE_LOAD_VISION NULL
#define FAKE_ENCODE_IMAGE NULL
#endif

/* Version 9 members; an older table carries entries here that a loader must neither read
 * nor call (they abort). FAKE_PREPROCESS_ORPHAN: a version-9 table setting them without
 * load_vision, refused. */
static ts_status preprocess_image_trap(ts_model* m, const ts_image* i, ts_pixel_shape* s,
                                       float* out, int64_t n) {
  (void)m;
  (void)i;
  (void)s;
  (void)out;
  (void)n;
  abort();
}
static ts_status set_vision_options_trap(ts_model* m, const ts_vision_options* o) {
  (void)m;
  (void)o;
  abort();
}
#if FAKE_API_VERSION < 9 || defined(FAKE_PREPROCESS_ORPHAN)
#define FAKE_PREPROCESS_IMAGE preprocess_image_trap
#define FAKE_SET_VISION_OPTIONS set_vision_options_trap
#else
#define FAKE_PREPROCESS_IMAGE NULL
#define FAKE_SET_VISION_OPTIONS NULL
#endif

#ifdef FAKE_MISSING_FN
#define FAKE_POSITION NULL
#else
#define FAKE_POSITION position
#endif

static const ts_backend kFake = {FAKE_API_VERSION,
                                 "fake",
                                 "0",
                                 last_error,
                                 device_name,
                                 capabilities,
                                 load_model,
                                 free_model,
                                 n_vocab,
                                 open_session,
                                 free_session,
                                 prefill,
                                 decode,
                                 rewind_to,
                                 FAKE_POSITION,
                                 FAKE_GREEDY,
                                 FAKE_ARCHITECTURES,
                                 FAKE_FEATURES,
                                 FAKE_SET_TAPS,
                                 FAKE_READ_TAPS,
                                 FAKE_STEP_BATCH,
                                 FAKE_FORK,
                                 FAKE_SET_GRAMMAR,
                                 FAKE_GRAMMAR_MASK,
                                 FAKE_GRAMMAR_GREEDY,
                                 FAKE_PREFILL_EMBEDDINGS,
                                 FAKE_LOAD_VISION,
                                 FAKE_ENCODE_IMAGE,
                                 FAKE_PREPROCESS_IMAGE,
                                 FAKE_SET_VISION_OPTIONS};

__attribute__((visibility("default"))) const ts_backend* touchstone_backend_entry(void) {
#ifdef FAKE_NULL_ENTRY
  return NULL;
#else
  return &kFake;
#endif
}
