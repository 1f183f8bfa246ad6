// Dummy (random) weights filled on the device: the counter-based hash of
// kestrel_core::dummy::dummy_value, so a tensor gets the same values as the
// host version, bit for bit. Used by `--load-format dummy`.
#include "common.cuh"
#include "dummy.cuh"

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
