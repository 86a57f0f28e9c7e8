#version 450
// argmax.comp - index of the largest of n floats x[off .. off + n) into
// result[0]: NaN entries are skipped, ties go to the lowest index, -1 when every
// entry is NaN (as metrics::argmax). One workgroup of 64: each invocation scans
// i = tid, tid + 64, ... keeping its first maximum, then a shared-memory tree
// keeps the larger value, or the lower index on equal values.
layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer R { int result[]; };

layout(push_constant) uniform PC {
  uint n, off;
}
pc;

#define NONE 0xFFFFFFFFu
shared float best_v[64];
shared uint best_i[64];

void main() {
  const uint tid = gl_LocalInvocationID.x;
  float v = 0.0;
  uint idx = NONE;
  for (uint i = tid; i < pc.n; i += 64u) {
    const float xi = x[pc.off + i];
    if (!isnan(xi) && (idx == NONE || xi > v)) {
      v = xi;
      idx = i;
    }
  }
  best_v[tid] = v;
  best_i[tid] = idx;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) {
      const float ov = best_v[tid + s];
      const uint oi = best_i[tid + s];
      const uint mi = best_i[tid];
      if (oi != NONE && (mi == NONE || ov > best_v[tid] || (ov == best_v[tid] && oi < mi))) {
        best_v[tid] = ov;
        best_i[tid] = oi;
      }
    }
    barrier();
  }
  if (tid == 0u) result[0] = best_i[0] == NONE ? -1 : int(best_i[0]);
}
