// common.glsl - workgroup size and workgroup-wide sums, with a subgroup path
// (USE_SUBGROUP, needs subgroup arithmetic in compute) and a shared-memory
// tree fallback. Include after #version; define TILE (values summed at once)
// before including.
#extension GL_GOOGLE_include_directive : require
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

#define WG 64
#ifndef TILE
#define TILE 1
#endif

layout(local_size_x = WG, local_size_y = 1, local_size_z = 1) in;

shared float red_sh[WG * TILE];

// v[t] <- sum of v[t] over the workgroup, in every invocation. Must be called
// in uniform control flow.
void wg_sum(inout float v[TILE]) {
  const uint tid = gl_LocalInvocationID.x;
#ifdef USE_SUBGROUP
  for (int t = 0; t < TILE; ++t) v[t] = subgroupAdd(v[t]);
  if (subgroupElect()) {
    for (int t = 0; t < TILE; ++t) red_sh[gl_SubgroupID * TILE + t] = v[t];
  }
  barrier();
  for (int t = 0; t < TILE; ++t) {
    float s = 0.0;
    for (uint g = 0; g < gl_NumSubgroups; ++g) s += red_sh[g * TILE + t];
    v[t] = s;
  }
  barrier();
#else
  for (int t = 0; t < TILE; ++t) red_sh[tid * TILE + t] = v[t];
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (tid < s) {
      for (int t = 0; t < TILE; ++t) red_sh[tid * TILE + t] += red_sh[(tid + s) * TILE + t];
    }
    barrier();
  }
  for (int t = 0; t < TILE; ++t) v[t] = red_sh[t];
  barrier();
#endif
}

float wg_sum1(float x) {
#if TILE == 1
  float v[1] = float[1](x);
  wg_sum(v);
  return v[0];
#else
  float v[TILE];
  v[0] = x;
  for (int t = 1; t < TILE; ++t) v[t] = 0.0;
  wg_sum(v);
  return v[0];
#endif
}

// Workgroup max (shared-memory tree; used once per attention row).
float wg_max(float x) {
  const uint tid = gl_LocalInvocationID.x;
  red_sh[tid * TILE] = x;
  barrier();
  for (uint s = WG / 2; s > 0; s >>= 1) {
    if (tid < s) red_sh[tid * TILE] = max(red_sh[tid * TILE], red_sh[(tid + s) * TILE]);
    barrier();
  }
  const float r = red_sh[0];
  barrier();
  return r;
}

// tanh(x) without overflow for large |x| (exp(2x) would reach inf):
// sign(x) (1 - e) / (1 + e), e = exp(-2|x|).
float tanh_stable(float x) {
  const float e = exp(-2.0 * abs(x));
  return sign(x) * (1.0 - e) / (1.0 + e);
}
