// Tensor-core and async-copy helpers of the attention kernels (sm_80+ PTX,
// available on every target of this build).
#pragma once
#include "common.cuh"

constexpr unsigned FULL_MASK = 0xffffffffu;
// Softmaxes run in base 2: scores are pre-multiplied by log2(e).
constexpr float LOG2E = 1.4426950408889634f;

// d += a * b for one m16n8k16 tile: bf16 inputs, f32 accumulation. Register
// layouts (PTX ISA, "mma.m16n8k16"), with g = lane / 4 and c = lane % 4:
//   a[0] = A[g][2c..2c+1]     a[1] = A[g+8][2c..2c+1]
//   a[2] = A[g][2c+8..2c+9]   a[3] = A[g+8][2c+8..2c+9]
//   b0 = B[2c..2c+1][g]       b1 = B[2c+8..2c+9][g]
//   d[0..1] = D[g][2c..2c+1]  d[2..3] = D[g+8][2c..2c+1]
// (pairs are packed low element first).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row
// addresses of matrix i, which lands in r[i] (thread t: row t/4, cols 2(t%4)..+1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The same, transposed: thread t gets rows 2(t%4)..+1 of column t/4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 16-byte global -> shared copy that bypasses L1; `valid == false` writes zeros
// (and reads nothing), which is how out-of-range rows of a tile are cleared.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Shared tiles hold rows of D bf16 as 16-byte chunks; chunk ch of row r sits
// at ch ^ (r % 8), so the 8 row addresses of every ldmatrix hit distinct banks.
template <int D>
__device__ __forceinline__ int tile_swz(int row, int ch) {
    return row * (D / 8) + (ch ^ (row & 7));
}

// Max and sum over the four lanes of a quad (the lanes sharing one mma row).
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

// KV cache row of `key` of one sequence (`table` = its pages), kv head `kvh`;
// the cache is laid out [slot, hkv, D] with slot = page * block_size + offset.
__device__ __forceinline__ int64_t kv_row(const int* table, int key, int block_size, int hkv, int kvh) {
    const int64_t slot = (int64_t)table[key / block_size] * block_size + key % block_size;
    return slot * hkv + kvh;
}
