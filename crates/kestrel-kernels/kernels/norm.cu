// RMSNorm and fused residual-add + RMSNorm. One block per row; f32 throughout.
#include "common.cuh"

// Rows of up to ADD_NORM_REGS * blockDim.x values stay in registers between
// the sum and the scaling: all loads of a thread are issued together, and the
// updated residual is not read back from memory (decode calls this ~80 times
// a step on one row, where each memory round trip is pure latency).
constexpr int ADD_NORM_REGS = 16;

// One row in 16-byte accesses, held in registers (cols % 4 == 0 and cols <=
// ADD_NORM_REGS * blockDim.x): h = residual (+ x when ADD, written back to
// residual), out = h * rsqrt(mean(h^2) + eps) * w. The sum of squares is the
// one gemv_norm's prologue forms (gemv.cu: sum_sq4 over the same float4s per
// thread, then block_sum), so a row normalised here and there is the same.
template <bool ADD>
__device__ __forceinline__ void norm_row_f4(float* __restrict__ o, __nv_bfloat16* __restrict__ ob,
                                            float* __restrict__ rr, const float* __restrict__ xr,
                                            const float* __restrict__ w, int cols, float eps, float* scratch) {
    constexpr int V = ADD_NORM_REGS / 4;
    const int quads = cols / 4;
    float4 v[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < quads) {
            const float4 a = reinterpret_cast<const float4*>(rr)[q];
            if constexpr (ADD) {
                const float4 b = reinterpret_cast<const float4*>(xr)[q];
                v[j] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
            } else {
                v[j] = a;
            }
        } else {
            v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (ADD && q < quads) reinterpret_cast<float4*>(rr)[q] = v[j];
        ss = sum_sq4(ss, v[j]);
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        const float4 wq = q < quads ? reinterpret_cast<const float4*>(w)[q] : make_float4(0.f, 0.f, 0.f, 0.f);
        v[j] = make_float4(v[j].x * inv * wq.x, v[j].y * inv * wq.y, v[j].z * inv * wq.z, v[j].w * inv * wq.w);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < quads) reinterpret_cast<float4*>(o)[q] = v[j];
    }
    if (ob != nullptr) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const int q = threadIdx.x + j * blockDim.x;
            if (q < quads)
                reinterpret_cast<uint2*>(ob)[q] = make_uint2(pack_bf16(v[j].x, v[j].y), pack_bf16(v[j].z, v[j].w));
        }
    }
}

__device__ __forceinline__ bool fits_f4(int cols) { return cols % 4 == 0 && cols <= ADD_NORM_REGS * (int)blockDim.x; }

// out = x * rsqrt(mean(x^2) + eps) * w
KESTREL_EXTERN void rms_norm_f32(float* __restrict__ out, const float* __restrict__ x,
                                 const float* __restrict__ w, int cols, float eps) { pdl_begin();
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const float* xr = x + row * cols;
    if (fits_f4(cols)) {
        // Read only: the row is never written back without ADD.
        norm_row_f4<false>(out + row * cols, nullptr, const_cast<float*>(xr), nullptr, w, cols, eps, scratch);
        return;
    }
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
    const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[row * cols + c] = xr[c] * inv * w[c];
}

// residual += x; out = rms_norm(residual) * w
// out_bf16, when not null, also receives out rounded to bf16 (the input of
// a prefill's cuBLAS product; the same rounding as f32_to_bf16_kernel).
KESTREL_EXTERN void add_rms_norm_f32(float* __restrict__ out, __nv_bfloat16* __restrict__ out_bf16,
                                     float* __restrict__ residual, const float* __restrict__ x,
                                     const float* __restrict__ w, int cols, float eps) { pdl_begin();
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    float* rr = residual + row * cols;
    const float* xr = x + row * cols;
    float* o = out + row * cols;
    __nv_bfloat16* ob = out_bf16 != nullptr ? out_bf16 + row * cols : nullptr;
    float ss = 0.f;
    if (fits_f4(cols)) {
        // 16-byte accesses (4-byte ones fell well short of the memory
        // bandwidth on prefill rows).
        norm_row_f4<true>(o, ob, rr, xr, w, cols, eps, scratch);
        return;
    }
    if (cols <= ADD_NORM_REGS * (int)blockDim.x) {
        float v[ADD_NORM_REGS];
#pragma unroll
        for (int j = 0; j < ADD_NORM_REGS; ++j) {
            const int c = threadIdx.x + j * blockDim.x;
            v[j] = c < cols ? rr[c] + xr[c] : 0.f;
        }
#pragma unroll
        for (int j = 0; j < ADD_NORM_REGS; ++j) {
            const int c = threadIdx.x + j * blockDim.x;
            if (c < cols) rr[c] = v[j];
            ss += v[j] * v[j];
        }
        const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
#pragma unroll
        for (int j = 0; j < ADD_NORM_REGS; ++j) {
            const int c = threadIdx.x + j * blockDim.x;
            v[j] = c < cols ? v[j] * inv * w[c] : 0.f;
        }
        // Stores after all the weight loads, the bf16 copy in a loop of its
        // own: a branch between loads and stores in one loop kept the
        // weight loads from being issued together (slower decode calls).
#pragma unroll
        for (int j = 0; j < ADD_NORM_REGS; ++j) {
            const int c = threadIdx.x + j * blockDim.x;
            if (c < cols) o[c] = v[j];
        }
        if (ob != nullptr) {
#pragma unroll
            for (int j = 0; j < ADD_NORM_REGS; ++j) {
                const int c = threadIdx.x + j * blockDim.x;
                if (c < cols) ob[c] = f32_to_bf16(v[j]);
            }
        }
        return;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = rr[c] + xr[c];
        rr[c] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float y = rr[c] * inv * w[c];
        o[c] = y;
        if (ob != nullptr) ob[c] = f32_to_bf16(y);
    }
}
