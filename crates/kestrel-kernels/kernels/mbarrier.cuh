// Shared-memory barriers (sm_90): a phase completes when its arrivals and
// the bytes it expects have all come. Loads by TMA and stores by other blocks
// of a cluster (st.async) count their bytes on the barrier they name, so a
// block can wait for exactly the data it needs instead of for a barrier over
// all blocks, which would also wait for every store issued before it.
#pragma once
#include "common.cuh"

// One arrival per phase: the thread that arms it with mbar_expect.
__device__ __forceinline__ void mbar_init1(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
}

// Makes barrier initialisations visible to the cluster (before the cluster
// barrier that follows them, and before any other block signals one).
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The arming thread's arrival, expecting `bytes` in this phase (bytes that
// came earlier in the phase count).
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// Waits for the phase of the given parity. The acquire is the default
// (.cta): what the phase counts lands in this block's own shared memory
// (loads it issued, or parts other blocks stored into it with
// st_async_f32), which no cache stands in front of. A .cluster acquire
// would also invalidate L1 at every wait.
__device__ __forceinline__ void mbar_wait_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n"
            "}\n"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
    }
}

// Stores `v` at `dst` in the shared memory of cluster block `rank` (`dst` and
// `bar` are this block's addresses of the same variables) and counts its 4
// bytes on that block's barrier `bar`.
__device__ __forceinline__ void st_async_f32(float* dst, uint64_t* bar, uint32_t rank, float v) {
    uint32_t rdst, rbar;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rdst) : "r"(smem_addr(dst)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rbar) : "r"(smem_addr(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(rdst),
                 "r"(__float_as_uint(v)), "r"(rbar)
                 : "memory");
}
