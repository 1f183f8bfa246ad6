// Row-wise data movement and cheap element-wise math. Built with fast math:
// nothing here feeds a softmax, decay or rotary angle.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"

// out[t, :] = table[ids[t], :] widened to f32. Grid (ceil(cols/256), rows).
KESTREL_EXTERN void embedding_bf16(float* __restrict__ out, const __nv_bfloat16* __restrict__ table,
                                   const uint32_t* __restrict__ ids, int cols) { pdl_begin();
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    out[(size_t)t * cols + c] = bf16_to_f32(table[(size_t)ids[t] * cols + c]);
}

// The same for an f16 table (the reference precision's f16 checkpoints).
KESTREL_EXTERN void embedding_f16(float* __restrict__ out, const __half* __restrict__ table,
                                  const uint32_t* __restrict__ ids, int cols) { pdl_begin();
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    out[(size_t)t * cols + c] = __half2float(table[(size_t)ids[t] * cols + c]);
}

// The same for a block-FP8 table (an FP8 lm_head's rows, for a reduced draft
// vocabulary): each e4m3 code times its 128 x 128 block's f32 scale, in f32,
// as the CPU reference dequantises.
KESTREL_EXTERN void embedding_fp8(float* __restrict__ out, const uint8_t* __restrict__ codes,
                                  const float* __restrict__ scales, const uint32_t* __restrict__ ids, int cols) {
    pdl_begin();
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const size_t id = ids[t];
    const int scale_cols = (cols + 127) / 128;
    const __half h = __half(__nv_cvt_fp8_to_halfraw(codes[id * cols + c], __NV_E4M3));
    out[(size_t)t * cols + c] = __half2float(h) * scales[(id / 128) * scale_cols + c / 128];
}

// out[i, :] = x[rows[i], :]. Grid (ceil(cols/256), n).
KESTREL_EXTERN void gather_rows_f32(float* __restrict__ out, const float* __restrict__ x,
                                    const uint32_t* __restrict__ rows, int cols) { pdl_begin();
    const int i = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    out[(size_t)i * cols + c] = x[(size_t)rows[i] * cols + c];
}

KESTREL_EXTERN void add_assign_f32(float* __restrict__ a, const float* __restrict__ b, size_t n) { pdl_begin();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}

// out[t, j] = silu(gu[t, j]) * gu[t, inter + j]. Grid (ceil(inter/256), rows).
KESTREL_EXTERN void swiglu_f32(float* __restrict__ out, const float* __restrict__ gu, int inter) { pdl_begin();
    const int t = blockIdx.y;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= inter) return;
    const float* row = gu + (size_t)t * 2 * inter;
    const float g = row[j];
    out[(size_t)t * inter + j] = g / (1.f + __expf(-g)) * row[inter + j];
}

// Eight values per thread: two 16-byte loads, one 16-byte store. One value
// and a 2-byte store per thread made the conversion of a prefill's projection
// inputs a large share of the product it feeds
// (docs/benchmarks/2026-12-01-code-comment-measurements.md). x and out
// 16-byte aligned.
// Grid ceil(n / 8 / 256), block 256.
KESTREL_EXTERN void f32_to_bf16_kernel(__nv_bfloat16* __restrict__ out, const float* __restrict__ x, size_t n) { pdl_begin();
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 8 <= n) {
        const float4 a = reinterpret_cast<const float4*>(x + i)[0];
        const float4 b = reinterpret_cast<const float4*>(x + i)[1];
        const __nv_bfloat162 o[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                                     __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
        *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(o);
    } else {
        for (size_t j = i; j < n; ++j) out[j] = f32_to_bf16(x[j]);
    }
}
