// faults.glsl - the shader-level faults of the test-only fault catalog
// (docs/backends/vulkan.md#fault-catalog) as specialization constants. Every
// default is the correct shader. The driver folds the constants when it builds
// a pipeline, so the pipelines built without specialization info (every
// session without a fault) carry no fault code; a session opened with one of
// these faults builds its own pipelines with that constant set
// (Kernels(ctx, ShaderFaults), src/vk_kernels.h, which mirrors the IDs).
// Include after #version; a shader uses only the constants it needs.
#ifndef TOUCHSTONE_FAULTS_GLSL
#define TOUCHSTONE_FAULTS_GLSL

// rope_layout: RoPE pairs (j, j + hd/2) (NeoX) on the interleaved model.
layout(constant_id = 0) const bool FAULT_ROPE_LAYOUT = false;
// kv_write_next: K/V of position p stored in row p + 1 of the cache.
layout(constant_id = 1) const bool FAULT_KV_WRITE_NEXT = false;
// gqa_mapping: query head h reads KV head h % n_head_kv (not h / group).
layout(constant_id = 2) const bool FAULT_GQA_MAPPING = false;
// softmax_no_max: exp(s) / sum exp(s) in fp32 without subtracting the max.
layout(constant_id = 3) const bool FAULT_SOFTMAX_NO_MAX = false;
// causal_mask: every token of a prefill chunk attends to the whole chunk.
layout(constant_id = 4) const bool FAULT_CAUSAL_MASK = false;
// fp16_accumulation: every matmul output rounded through fp16 (before a residual add).
layout(constant_id = 5) const bool FAULT_FP16_OUT = false;
// thread_order_reduction: each row sum split into FAULT_SPLIT_K slices of whole
// 32-element blocks (the session's n_threads), each slice's partial sum staged
// in fp16, the slices added in slice order in fp32. 1 = no split (correct).
layout(constant_id = 6) const uint FAULT_SPLIT_K = 1u;
// nibble_order: Q4_0/Q4_1 quants read with each byte's low and high nibbles swapped.
layout(constant_id = 7) const bool FAULT_NIBBLE_ORDER = false;
// quant_scale_min_swap: Q4_1 blocks read with d and m swapped.
layout(constant_id = 8) const bool FAULT_SCALE_MIN_SWAP = false;

// x rounded to the nearest fp16 value and back (FAULT_FP16_OUT, FAULT_SPLIT_K).
float fault_round_fp16(float x) { return unpackHalf2x16(packHalf2x16(vec2(x, 0.0))).x; }

#endif
