// entry.cpp - the one exported symbol of libtouchstone_backend_cpu_simd.so.
#include "cpu_simd_backend.h"

extern "C" __attribute__((visibility("default"))) const ts_backend* touchstone_backend_entry(void) {
  return touchstone::cpu_simd::backend_table();
}
