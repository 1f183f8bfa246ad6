// Dummy (random) weights filled on the device: the counter-based hash of
// kestrel_core::dummy::dummy_value, so a tensor gets the same values as the
// host version, bit for bit. Used by `--load-format dummy`.
#include "common.cuh"

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float dummy_value(uint64_t seed, uint64_t i, float offset, float scale) {
    const uint64_t z = mix64(seed + i * 0x9e3779b97f4a7c15ull);
    const float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    return fmaf(scale, 2.0f * u - 1.0f, offset);
}

// Grid-stride fill of n bf16 values.
KESTREL_EXTERN void dummy_fill_bf16(__nv_bfloat16* __restrict__ out, size_t n, uint64_t seed,
                                    float offset, float scale) { pdl_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        out[i] = f32_to_bf16(dummy_value(seed, i, offset, scale));
    }
}

// Grid-stride fill of n f32 values; round_bf16 != 0 rounds each through bf16
// first (a bf16 vector the backend keeps in f32).
KESTREL_EXTERN void dummy_fill_f32(float* __restrict__ out, size_t n, uint64_t seed, float offset,
                                   float scale, int round_bf16) { pdl_begin();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = dummy_value(seed, i, offset, scale);
        out[i] = round_bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
    }
}
