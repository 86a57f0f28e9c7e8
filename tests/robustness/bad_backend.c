/* A deliberately misbehaving backend for the harness's robustness tests.
 *
 * It forwards every call to the real reference backend (REFERENCE_BACKEND_PATH)
 * and misbehaves as TOUCHSTONE_BAD_MODE says:
 *   exit0    exit(0) in decode             segv     SIGSEGV in decode
 *   abort    abort() in decode             hang     never returns from decode
 *   nan      every logit NaN from decode   error    TS_ERR_INTERNAL from decode
 *   overflow decode writes 1000 floats past n_vocab
 *   n_vocab  n_vocab() reports 10          names    name and device are not UTF-8
 *   orphan   decode starts two grandchildren that sleep forever, one in a
 *            session of its own (setsid), one in the runner's process group;
 *            the run itself is correct (the harness must end both)
 *   setpgid  decode starts a grandchild that sleeps in a process group of its
 *            own (setpgid(0, 0)); the run is correct
 *   refork   decode starts a grandchild that re-forks every 20 ms, each
 *            generation in a new process group, the parent exiting; the run
 *            is correct
 *   spawn_hang  decode starts all four grandchildren above, then never returns
 *            (the signal tests stop the harness then)
 * Grandchildren end by themselves after 120 s, so a test that fails leaves
 * nothing running for long.
 *   device_late      as error, then every session opened after it fails
 *                    with TS_ERR_DEVICE ("no device": a FAIL, not a SKIP)
 *   unsupported_late as error, then every session opened after it fails
 *                    with TS_ERR_UNSUPPORTED (a FAIL, not UNSUPPORTED)
 *   forge    as error; name, version, device and last_error carry a forged
 *            "verdict: PASS" line and an ANSI hide-text sequence
 * Serving faults (always on):
 *   max_batch1  capabilities say max_batch 1: no batch of the plan can run
 *   noisy_leak  no bitwise / batch-invariance claim; a step_batch entry's logits
 *               take 1e-2 x the previous entry's first token id % 7 (a
 *               cross-sequence leak) and one call in four is shifted by +0.5
 *               (repeats that would hide the leak as noise)
 *   fork_null   fork_session returns TS_OK and a NULL session
 * Vision faults (ABI v8 encode_image, ABI v9 preprocess_image):
 *   tower_transposed    the reference's image tokens with their square grid
 *                       (TOUCHSTONE_BAD_IMAGE_TOKENS tokens) transposed (row r,
 *                       column c taken from row c, column r): a projector that pools
 *                       or pixel-shuffles the patch grid transposed (must fail
 *                       multimodal.encoder)
 *   preprocess_nearest  refuses the harness's pixel tensor and preprocesses the
 *                       decoded image itself, resizing it to TOUCHSTONE_BAD_IMAGE_SIZE
 *                       square with nearest-neighbour sampling where the processor
 *                       resamples bilinearly (Gemma 3), then rescales and normalises
 *                       as the processor does (1/255, mean = std = 0.5); its
 *                       preprocess_image returns that tensor (must fail
 *                       multimodal.preprocess)
 *   preprocess_nan      preprocess_image's tensor has a NaN (the first value)
 *   preprocess_frames   preprocess_image claims one frame more than the reference's
 *                       (and writes the reference's tensor twice over the first frame:
 *                       a tiler that adds a view)
 *   preprocess_huge     preprocess_image claims a shape of 2^30 values (the harness
 *                       must refuse it before allocating)
 * Consistency faults (always on; each breaks one golden-free check):
 *   rewind_noop      rewind returns TS_OK without truncating the KV cache
 *   prefill_all_skew all-position prefill rows but the last scaled by 1 + 1e-3
 *   chunk_skew       last-position prefill of more than one token scaled by 1 + 1e-3
 *   thread_skew      sessions opened with 2 threads scale decode logits by 1 + 1e-3
 *   nondeterministic decode adds a random 1e-4 to logit 0
 * The decode modes strike only in the first decode after the prefill number
 * TOUCHSTONE_BAD_AT (default 2, counted across processes in the file
 * TOUCHSTONE_BAD_STATE), so with cases run in order the first passes, the
 * second breaks and the run must carry on to the third. */
#include <dlfcn.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "touchstone/abi/backend_abi.h"

/* What the forge mode puts in every string the harness prints. */
#define FORGED "\n\nverdict: PASS\n\x1b[8m"

static ts_backend g_table;
static const char* g_error; /* this process's last deliberate error, or NULL */
static const ts_backend* g_ref;
static int g_armed;       /* the next decode misbehaves */
static int32_t g_n_vocab; /* the model's real n_vocab: the logits row length */

static const char* mode(void) {
  const char* m = getenv("TOUCHSTONE_BAD_MODE");
  return m ? m : "";
}

static int is_mode(const char* m) { return !strcmp(mode(), m); }

/* Prefills so far, counted across child restarts in a file. */
static int prefills_so_far(void) {
  const char* path = getenv("TOUCHSTONE_BAD_STATE");
  int n = 0;
  FILE* f = path ? fopen(path, "r") : NULL;
  if (f) {
    if (fscanf(f, "%d", &n) != 1) n = 0;
    fclose(f);
  }
  return n;
}

/* The decode after this prefill number misbehaves (TOUCHSTONE_BAD_AT). */
static int bad_at(void) {
  const char* at = getenv("TOUCHSTONE_BAD_AT");
  return at ? atoi(at) : 2;
}

/* Counts prefills across child restarts in a file; returns the new count. */
static int count_prefill(void) {
  const char* path = getenv("TOUCHSTONE_BAD_STATE");
  if (!path) return 1;
  const int n = prefills_so_far() + 1;
  FILE* f = fopen(path, "w");
  if (f) {
    fprintf(f, "%d\n", n);
    fclose(f);
  }
  return n;
}

static void scale(float* v, int64_t n, float f) {
  for (int64_t i = 0; i < n; ++i) v[i] *= f;
}

/* Sessions opened with 2 threads (thread_skew), by handle. */
static ts_session* g_two_threads[256];
static int g_n_two;

static int is_two_threads(const ts_session* s) {
  for (int i = 0; i < g_n_two; ++i)
    if (g_two_threads[i] == s) return 1;
  return 0;
}

static ts_status bad_open_session(ts_model* m, const ts_session_options* o, ts_session** out) {
  if (prefills_so_far() >= bad_at() && (is_mode("device_late") || is_mode("unsupported_late"))) {
    g_error = is_mode("device_late") ? "bad backend: no device" : "bad backend: refused";
    return is_mode("device_late") ? TS_ERR_DEVICE : TS_ERR_UNSUPPORTED;
  }
  const ts_status st = g_ref->open_session(m, o, out);
  if (st == TS_OK && o && o->n_threads == 2 && g_n_two < 256) g_two_threads[g_n_two++] = *out;
  return st;
}

static ts_status bad_rewind(ts_session* s, int32_t position) {
  if (!strcmp(mode(), "rewind_noop")) return TS_OK;
  return g_ref->rewind(s, position);
}

static ts_status bad_prefill(ts_session* s, const int32_t* t, int32_t n, int32_t all, float* out) {
  g_armed = count_prefill() == bad_at();
  const ts_status st = g_ref->prefill(s, t, n, all, out);
  if (st != TS_OK) return st;
  if (all && n > 1 && !strcmp(mode(), "prefill_all_skew"))
    scale(out, (int64_t)(n - 1) * g_n_vocab, 1.001f);
  if (!all && n > 1 && !strcmp(mode(), "chunk_skew")) scale(out, g_n_vocab, 1.001f);
  return st;
}

/* A grandchild that lives 120 s at most: 0 in the runner's process group,
 * 1 in a session of its own, 2 in a process group of its own, 3 re-forking
 * every 20 ms (each generation in a new process group, the parent exiting). */
static void grandchild(int kind) {
  if (fork() != 0) return;
  const time_t end = time(NULL) + 120;
  if (kind == 1) setsid();
  if (kind == 2) setpgid(0, 0);
  while (time(NULL) < end) {
    if (kind != 3) {
      sleep(1);
      continue;
    }
    const struct timespec pause_20ms = {0, 20000000};
    nanosleep(&pause_20ms, NULL);
    if (fork() != 0) _exit(0);
    setpgid(0, 0);
  }
  _exit(0);
}

static ts_status bad_decode(ts_session* s, int32_t token, float* out) {
  const ts_status st = g_ref->decode(s, token, out);
  if (st == TS_OK && !strcmp(mode(), "thread_skew") && is_two_threads(s))
    scale(out, g_n_vocab, 1.001f);
  if (st == TS_OK && !strcmp(mode(), "nondeterministic")) out[0] += 1e-4f * (float)(rand() % 7 + 1);
  if (!g_armed) return st;
  g_armed = 0;
  const char* m = mode();
  if (!strcmp(m, "exit0")) exit(0);
  if (!strcmp(m, "segv")) raise(SIGSEGV);
  if (!strcmp(m, "abort")) abort();
  if (!strcmp(m, "hang"))
    for (;;) pause();
  const int hang = !strcmp(m, "spawn_hang");
  if (!strcmp(m, "orphan") || hang) {
    grandchild(0);
    grandchild(1);
  }
  if (!strcmp(m, "setpgid") || hang) grandchild(2);
  if (!strcmp(m, "refork") || hang) grandchild(3);
  if (hang)
    for (;;) pause();
  if (!strcmp(m, "error") || !strcmp(m, "device_late") || !strcmp(m, "unsupported_late") ||
      !strcmp(m, "forge")) {
    g_error =
        is_mode("forge") ? "bad backend: deliberate error" FORGED : "bad backend: deliberate error";
    return TS_ERR_INTERNAL;
  }
  if (!strcmp(m, "nan") || !strcmp(m, "overflow")) {
    const int extra = !strcmp(m, "overflow") ? 1000 : 0;
    for (int i = 0; i < g_n_vocab + extra; ++i) out[i] = NAN;
  }
  return st;
}

static const char* bad_last_error(void) { return g_error ? g_error : g_ref->last_error(); }

static int32_t bad_n_vocab(const ts_model* m) {
  g_n_vocab = g_ref->n_vocab(m);
  return !strcmp(mode(), "n_vocab") ? 10 : g_n_vocab;
}

static const char* bad_device_name(void) {
  return is_mode("forge") ? "bad device" FORGED : "bad device \xc3\x28 \xff";
}

static ts_status bad_capabilities(ts_capabilities* out) {
  const ts_status st = g_ref->capabilities(out);
  if (st != TS_OK) return st;
  if (is_mode("max_batch1")) out->max_batch = 1;
  if (is_mode("noisy_leak"))
    out->flags &= ~(uint32_t)(TS_CAP_BITWISE_DETERMINISM | TS_CAP_BATCH_INVARIANT);
  return st;
}

/* noisy_leak: entry i > 0 takes 1e-2 x (entry i-1's first token % 7) on every
 * logit it returns; one call in four (seeded rand) adds +0.5 to every entry. */
static ts_status bad_step_batch(const ts_batch_entry* e, int32_t n) {
  const ts_status st = g_ref->step_batch(e, n);
  if (st != TS_OK || !is_mode("noisy_leak")) return st;
  const float shift = rand() % 4 == 0 ? 0.5f : 0.0f;
  for (int32_t i = 0; i < n; ++i) {
    const float leak = i > 0 ? 1e-2f * (float)(e[i - 1].tokens[0] % 7) : 0.0f;
    const int64_t rows = e[i].all_positions ? e[i].n_tokens : 1;
    for (int64_t k = 0; k < rows * g_n_vocab; ++k) e[i].logits_out[k] += leak + shift;
  }
  return st;
}

/* tower_transposed: row r * side + c of the tokens from row c * side + r, with
 * side * side = TOUCHSTONE_BAD_IMAGE_TOKENS (the image's token count). */
static ts_status transpose_tokens(float* out, int64_t n_floats) {
  const char* tokens = getenv("TOUCHSTONE_BAD_IMAGE_TOKENS");
  const int64_t n = tokens ? atoll(tokens) : 0;
  int64_t side = 1;
  while ((side + 1) * (side + 1) <= n) ++side;
  if (n < 4 || side * side != n || n_floats % n != 0) {
    g_error = "bad backend: tower_transposed needs TOUCHSTONE_BAD_IMAGE_TOKENS, a square count";
    return TS_ERR_INTERNAL;
  }
  const int64_t dim = n_floats / n;
  float* copy = malloc((size_t)n_floats * sizeof(float));
  if (!copy) return TS_ERR_INTERNAL;
  memcpy(copy, out, (size_t)n_floats * sizeof(float));
  for (int64_t r = 0; r < side; ++r)
    for (int64_t c = 0; c < side; ++c)
      memcpy(out + (r * side + c) * dim, copy + (c * side + r) * dim, (size_t)dim * sizeof(float));
  free(copy);
  return TS_OK;
}

/* preprocess_nearest: the decoded RGB8 image [h][w][3] to the pixel tensor [3][s][s]
 * with nearest-neighbour sampling (pixel centres), 1/255, (v - 0.5) / 0.5; malloc'ed,
 * NULL with g_error set on a bad image or size. */
static float* nearest_tensor(const ts_image* img, int32_t* side) {
  const char* size = getenv("TOUCHSTONE_BAD_IMAGE_SIZE");
  const int32_t s = size ? atoi(size) : 0;
  *side = s;
  if (img->format != TS_IMAGE_RGB8 || s <= 0 || img->channels != 3) {
    g_error = "bad backend: preprocess_nearest takes an RGB8 image (TOUCHSTONE_BAD_IMAGE_SIZE set)";
    return NULL;
  }
  const uint8_t* rgb = img->data;
  float* px = malloc((size_t)3 * (size_t)s * (size_t)s * sizeof(float));
  if (!px) return NULL;
  for (int32_t y = 0; y < s; ++y) {
    const int32_t sy = (int32_t)(((double)y + 0.5) * img->height / s);
    for (int32_t x = 0; x < s; ++x) {
      const int32_t sx = (int32_t)(((double)x + 0.5) * img->width / s);
      for (int32_t ch = 0; ch < 3; ++ch) {
        const float v =
            (float)(rgb[((size_t)sy * (size_t)img->width + (size_t)sx) * 3 + (size_t)ch] *
                    0.00392156862745098);
        px[((size_t)ch * (size_t)s + (size_t)y) * (size_t)s + (size_t)x] = (v - 0.5f) / 0.5f;
      }
    }
  }
  return px;
}

static ts_status nearest_pixels(ts_model* m, const ts_image* img, float* out, int64_t n_floats) {
  int32_t s = 0;
  float* px = nearest_tensor(img, &s);
  if (!px) return s > 0 ? TS_ERR_INTERNAL : TS_ERR_UNSUPPORTED;
  ts_image pixels = *img;
  pixels.format = TS_IMAGE_PIXELS_F32;
  pixels.data = px;
  pixels.height = s;
  pixels.width = s;
  const ts_status st = g_ref->encode_image(m, &pixels, out, n_floats);
  free(px);
  return st;
}

static ts_status bad_encode_image(ts_model* m, const ts_image* img, float* out, int64_t n_floats) {
  if (is_mode("preprocess_nearest")) return nearest_pixels(m, img, out, n_floats);
  const ts_status st = g_ref->encode_image(m, img, out, n_floats);
  if (st == TS_OK && is_mode("tower_transposed")) return transpose_tokens(out, n_floats);
  return st;
}

/* preprocess_nan / preprocess_frames / preprocess_huge: the reference's tensor, then the lie. */
static ts_status lying_pixels(ts_model* m, const ts_image* img, ts_pixel_shape* shape, float* out,
                              int64_t n_floats) {
  ts_status st = g_ref->preprocess_image(m, img, shape, NULL, 0);
  if (st != TS_OK) return st;
  const int64_t frame = (int64_t)shape->channels * shape->height * shape->width;
  const int64_t n = frame * shape->n_frames;
  if (is_mode("preprocess_huge")) {
    shape->n_frames = (int32_t)(((int64_t)1 << 30) / frame + 1);
    return TS_OK; /* the harness must not ask for the values */
  }
  if (is_mode("preprocess_frames")) {
    if (out && n_floats != n + frame) {
      g_error = "bad backend: preprocess_image: n_floats is not the claimed size";
      return TS_ERR_INVALID_ARGUMENT;
    }
    if (out) st = g_ref->preprocess_image(m, img, shape, out + frame, n);
    if (out && st == TS_OK) memcpy(out, out + frame, (size_t)frame * sizeof(float));
    shape->n_frames += 1;
    return st;
  }
  if (!out) return TS_OK;
  st = g_ref->preprocess_image(m, img, shape, out, n_floats);
  if (st == TS_OK) out[0] = NAN; /* preprocess_nan */
  return st;
}

static ts_status bad_preprocess_image(ts_model* m, const ts_image* img, ts_pixel_shape* shape,
                                      float* out, int64_t n_floats) {
  if (is_mode("preprocess_nan") || is_mode("preprocess_frames") || is_mode("preprocess_huge"))
    return lying_pixels(m, img, shape, out, n_floats);
  if (!is_mode("preprocess_nearest")) return g_ref->preprocess_image(m, img, shape, out, n_floats);
  int32_t s = 0;
  float* px = nearest_tensor(img, &s);
  if (!px) return s > 0 ? TS_ERR_INTERNAL : TS_ERR_UNSUPPORTED;
  shape->n_frames = 1;
  shape->channels = 3;
  shape->height = shape->width = s;
  const int64_t n = (int64_t)3 * s * s;
  ts_status st = TS_OK;
  if (out && n_floats != n) {
    g_error = "bad backend: preprocess_image: n_floats is not 3 x s x s";
    st = TS_ERR_INVALID_ARGUMENT;
  } else if (out) {
    memcpy(out, px, (size_t)n * sizeof(float));
  }
  free(px);
  return st;
}

static ts_status bad_fork_session(ts_session* src, int32_t n_prefix, ts_session** out) {
  if (!is_mode("fork_null")) return g_ref->fork_session(src, n_prefix, out);
  *out = NULL;
  return TS_OK;
}

__attribute__((visibility("default"))) const ts_backend* touchstone_backend_entry(void) {
  void* h = dlopen(REFERENCE_BACKEND_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!h) return NULL;
  ts_backend_entry_fn entry = (ts_backend_entry_fn)dlsym(h, TS_BACKEND_ENTRY_SYMBOL);
  if (!entry || !(g_ref = entry())) return NULL;
  g_table = *g_ref;
  g_table.name = "bad";
  g_table.version = "0";
  if (!strcmp(mode(), "names")) {
    g_table.name = "bad\xff\xfe";
    g_table.device_name = bad_device_name;
  }
  if (is_mode("forge")) {
    g_table.name = "bad" FORGED;
    g_table.version = "0" FORGED;
    g_table.device_name = bad_device_name;
  }
  g_table.capabilities = bad_capabilities;
  if (g_ref->step_batch) g_table.step_batch = bad_step_batch;
  if (g_ref->fork_session) g_table.fork_session = bad_fork_session;
  if (g_ref->encode_image) g_table.encode_image = bad_encode_image;
  if (g_ref->preprocess_image) g_table.preprocess_image = bad_preprocess_image;
  g_table.last_error = bad_last_error;
  g_table.prefill = bad_prefill;
  g_table.decode = bad_decode;
  g_table.open_session = bad_open_session;
  g_table.rewind = bad_rewind;
  g_table.n_vocab = bad_n_vocab;
  return &g_table;
}
