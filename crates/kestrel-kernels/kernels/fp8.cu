// Block-FP8 weights (e4m3 codes, one f32 scale per 128 x 128 block): the
// bf16 copy a product without an FP8 kernel reads (prefill GEMMs), and
// random codes for `--load-format dummy`.
#include <cuda_fp8.h>

#include "common.cuh"
#include "dummy.cuh"

// out[i] = bf16(e4m3(codes[i]) * scale_inv[block of i]) over `mats` stacked
// matrices of [rows, cols], each with a [ceil(rows/128), ceil(cols/128)]
// scale grid. The product is exact in f32 (a 4-bit significand times a
// 24-bit one), then rounded once. Grid-stride over 4 codes per thread
// (cols % 4 == 0).
KESTREL_EXTERN void fp8_to_bf16(uint16_t* __restrict__ out, const uint8_t* __restrict__ codes,
                                const float* __restrict__ scale_inv, size_t mats, int rows, int cols) {
    pdl_begin();
    const size_t quads = mats * (size_t)rows * cols / 4;
    const int scale_rows = (rows + 127) / 128, scale_cols = (cols + 127) / 128;
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < quads; q += (size_t)gridDim.x * blockDim.x) {
        const size_t i = q * 4;
        const size_t row = i / cols;
        const int c = (int)(i % cols);
        const size_t mat = row / rows;
        const int r = (int)(row % rows);
        const float s = scale_inv[(mat * scale_rows + r / 128) * scale_cols + c / 128];
        const uint32_t v = *reinterpret_cast<const uint32_t*>(codes + i);
        uint32_t packed[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const __nv_fp8x2_storage_t pair = (__nv_fp8x2_storage_t)((v >> (16 * h)) & 0xffffu);
            const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
            packed[h] = pack_bf16(f.x * s, f.y * s);
        }
        *reinterpret_cast<uint2*>(out + i) = make_uint2(packed[0], packed[1]);
    }
}

// n random e4m3 codes: the nearest code (ties to even, saturating) to a
// value uniform in [-448, 448) drawn as kestrel_models::fp8::dummy_weight
// draws it on the host, so the device and host fills agree bit for bit.
KESTREL_EXTERN void fp8_dummy_codes(uint8_t* __restrict__ out, size_t n, uint64_t seed) {
    pdl_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = __nv_cvt_float_to_fp8(dummy_value(seed, i, 0.f, 448.f), __NV_SATFINITE, __NV_E4M3);
    }
}
