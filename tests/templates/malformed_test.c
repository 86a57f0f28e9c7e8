/* malformed_test.c - a backend template must refuse a malformed GGUF with TS_ERR_IO or
 * TS_ERR_UNSUPPORTED and a message naming the file, never crash (run under the asan preset it
 * also catches reads past the buffer). Files: the real model's first 2 MiB (header, metadata,
 * tensor infos, the start of the data) truncated at many lengths and with seeded random bytes
 * overwritten in the header and tensor infos; then the real model itself must load, and the
 * quantized path and any fault must be refused with TS_ERR_UNSUPPORTED.
 *
 * usage: malformed_test BACKEND.so MODEL.gguf SCRATCH_DIR   (exit 77: no model) */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "touchstone/abi/backend_abi.h"

static const ts_backend* b;
static int failures;

/* Writes n bytes of data to path and loads it: must fail with IO or UNSUPPORTED naming path. */
static void expect_refused(const char* path, const unsigned char* data, size_t n) {
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  ts_model* m = NULL;
  const ts_status st = b->load_model(path, &m);
  const char* msg = b->last_error();
  if (st == TS_OK) {
    b->free_model(m); /* a corruption the model survives (a changed token string): fine */
  } else if ((st != TS_ERR_IO && st != TS_ERR_UNSUPPORTED) || !strstr(msg, path)) {
    fprintf(stderr, "FAIL %zu bytes: status %d, message '%s'\n", n, (int)st, msg);
    ++failures;
  }
}

int main(int argc, char** argv) {
  if (argc != 4)
    return fprintf(stderr, "usage: %s BACKEND.so MODEL.gguf SCRATCH_DIR\n", argv[0]), 2;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  void* sym = lib ? dlsym(lib, TS_BACKEND_ENTRY_SYMBOL) : NULL;
  ts_backend_entry_fn entry = NULL;
  memcpy(&entry, &sym, sizeof entry); /* ISO C has no object -> function pointer cast */
  if (!entry || !(b = entry())) return fprintf(stderr, "cannot load %s\n", argv[1]), 2;
  FILE* f = fopen(argv[2], "rb");
  if (!f) return printf("SKIP: no model at %s\n", argv[2]), 77;
  enum { N = 2 << 20 };
  unsigned char* head = malloc(N);
  unsigned char* copy = malloc(N);
  const size_t n = fread(head, 1, N, f);
  fclose(f);
  char path[4096];
  snprintf(path, sizeof path, "%s/malformed.gguf", argv[3]);

  /* Truncations: every length up to 64 bytes, then every 9973rd. */
  for (size_t len = 0; len < n; len += len < 64 ? 1 : 9973) expect_refused(path, head, len);
  /* 300 corruptions of 1 to 4 bytes each in the first 1,200 bytes (header, llama.* metadata)
   * or the last 16,000 bytes before the 2 MiB cut (tensor infos, alignment padding). */
  unsigned long long x = 0x9e3779b97f4a7c15ull; /* xorshift64 */
  for (int i = 0; i < 300; ++i) {
    memcpy(copy, head, n);
    for (int k = 0; k < 1 + i % 4; ++k) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const size_t at = (i % 2 ? 0 : 1785664 - 16000) + (size_t)(x % (i % 2 ? 1200 : 16000));
      if (at < n) copy[at] = (unsigned char)(x >> 32);
    }
    expect_refused(path, copy, n);
  }
  remove(path);

  /* The real model loads; what the templates do not implement is refused. */
  ts_model* m = NULL;
  ts_session* s = NULL;
  ts_session_options o = {sizeof o, TS_WEIGHTS_QUANTIZED, 1, 64, NULL};
  if (b->load_model(argv[2], &m) != TS_OK) {
    fprintf(stderr, "FAIL: the model does not load: %s\n", b->last_error());
    return 1;
  }
  if (b->open_session(m, &o, &s) != TS_ERR_UNSUPPORTED)
    ++failures, fprintf(stderr, "FAIL: quantized\n");
  o.weight_path = TS_WEIGHTS_FULL_PRECISION, o.fault = "rope_layout";
  if (b->open_session(m, &o, &s) != TS_ERR_UNSUPPORTED)
    ++failures, fprintf(stderr, "FAIL: fault\n");
  b->free_model(m);
  free(head), free(copy);
  printf("%s: %s\n", argv[1], failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
