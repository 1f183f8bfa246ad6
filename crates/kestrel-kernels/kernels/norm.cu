// RMSNorm and fused residual-add + RMSNorm. One block per row; f32 throughout.
#include "common.cuh"

// out = x * rsqrt(mean(x^2) + eps) * w
KESTREL_EXTERN void rms_norm_f32(float* __restrict__ out, const float* __restrict__ x,
                                 const float* __restrict__ w, int cols, float eps) { pdl_begin();
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const float* xr = x + row * cols;
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
    const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[row * cols + c] = xr[c] * inv * w[c];
}

// residual += x; out = rms_norm(residual) * w
KESTREL_EXTERN void add_rms_norm_f32(float* __restrict__ out, float* __restrict__ residual,
                                     const float* __restrict__ x, const float* __restrict__ w, int cols,
                                     float eps) { pdl_begin();
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    float* rr = residual + row * cols;
    const float* xr = x + row * cols;
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = rr[c] + xr[c];
        rr[c] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[row * cols + c] = rr[c] * inv * w[c];
}
