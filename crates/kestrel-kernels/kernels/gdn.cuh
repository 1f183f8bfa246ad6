// Gated DeltaNet helpers shared by gdn.cu, gdn_decode.cu and gdn_chunk.cu.
// The formulas follow the CPU reference (kestrel-cpu/src/gdn) operation by
// operation, so that the f32 results differ only by rounding order.
#pragma once
#include "common.cuh"

constexpr int GDN_MAX_KERNEL = 8;
// transformers' l2norm epsilon for q and k.
constexpr float GDN_L2_EPS = 1e-6f;

// PyTorch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float gdn_softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// Log decay g = -exp(A_log) * softplus(a + dt_bias) (always <= 0).
__device__ __forceinline__ float gdn_log_decay(float a, float a_log, float dt_bias) {
    return -expf(a_log) * gdn_softplus(a + dt_bias);
}

// 1 / sqrt(sum of squares + eps): the L2 normalisation of q and k.
__device__ __forceinline__ float gdn_l2_inv(float sum_sq) { return 1.f / sqrtf(sum_sq + GDN_L2_EPS); }
