// The counter-based hash of kestrel_core::dummy::dummy_value, for weights
// filled on the device (dummy.cu, fp8.cu) with the host's values bit for bit.
#pragma once
#include <stdint.h>

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
