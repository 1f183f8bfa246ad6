// f32-accurate products on tensor cores ("3xTF32"), for kernels that must
// track the f32 CPU reference (gdn_chunk.cu). sm_80+ PTX, available on every
// target of this build.
//
// Each f32 operand x is split into two tf32 values, big = tf32(x) and
// small = tf32(x - big) (tf32 keeps 10 explicit mantissa bits; x - big is
// exact in f32), so big + small equals x to about 2^-22 relative. A product
// is then small*big + big*small + big*big, all accumulated in f32 by
// mma.m16n8k8; the dropped small*small term is below 2^-22 relative. The
// small terms go first so that they are added while the accumulator is
// still small. Results differ from plain f32 FMA chains by about 1e-6
// relative, and are deterministic (a fixed instruction sequence).
#pragma once
#include "attention_mma.cuh"  // smem_addr, ldmatrix_x4

// One m16n8k8 step's operands, split. Register layouts (PTX ISA,
// "mma.m16n8k8", .tf32), with g = lane / 4 and c = lane % 4:
//   A (16 x 8): a[0] = A[g][c]  a[1] = A[g+8][c]  a[2] = A[g][c+4]  a[3] = A[g+8][c+4]
//   B (8 x 8):  b[0] = B[c][g]  b[1] = B[c+4][g]
//   D (16 x 8): d[0] = D[g][2c]  d[1] = D[g][2c+1]  d[2] = D[g+8][2c]  d[3] = D[g+8][2c+1]
struct Tf32A {
    uint32_t big[4], small[4];
};
struct Tf32B {
    uint32_t big[2], small[2];
};

__device__ __forceinline__ uint32_t tf32_round(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void tf32_split(float x, uint32_t& big, uint32_t& small) {
    big = tf32_round(x);
    small = tf32_round(x - __uint_as_float(big));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += A B to about f32 accuracy (see the top of the file).
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const Tf32A& a, const Tf32B& b) {
    mma_tf32(d, a.small, b.big);
    mma_tf32(d, a.big, b.small);
    mma_tf32(d, a.big, b.big);
}

// d += A B with PASSES = 3 (3xTF32, above) or 1: the big halves only, plain
// TF32 (inputs rounded to 10 mantissa bits, f32 accumulation: ~5e-4
// relative per product, finer than the bf16 operands other servers feed
// their tensor cores). With one pass the small halves are never used, and
// the compiler drops their computation.
template <int PASSES>
__device__ __forceinline__ void mma_tf32x(float (&d)[4], const Tf32A& a, const Tf32B& b) {
    static_assert(PASSES == 1 || PASSES == 3, "1 or 3 passes");
    if (PASSES == 3) mma_3xtf32(d, a, b);
    else mma_tf32(d, a.big, b.big);
}

// An operand value as the products will read it: rounded to tf32 for one
// pass (the fragment loaders below then take it as is), left whole for
// three (they split it).
template <int PASSES>
__device__ __forceinline__ float tf32_operand(float x) {
    return PASSES == 1 ? __uint_as_float(tf32_round(x)) : x;
}

// A fragment from 32-bit registers as ldmatrix delivers them: with one pass
// the values were stored through tf32_operand<1> and are used as they are;
// with three each is split.
template <int PASSES>
__device__ __forceinline__ Tf32A tf32_a_from(const uint32_t (&r)[4]) {
    Tf32A f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (PASSES == 1) f.big[i] = r[i];
        else tf32_split(__uint_as_float(r[i]), f.big[i], f.small[i]);
    }
    return f;
}

// The A tile rows m0 .. m0 + 15, columns k0 .. k0 + 7 of a row-major f32
// matrix in shared memory with rows `stride` floats apart (a multiple of 4,
// and 4 mod 32 for conflict-free rows), in one ldmatrix.x4: an 8x8 b16
// matrix is 8 rows of 4 f32, and thread t receives element (t / 4, t % 4)
// of each, which is the tf32 A layout above for matrices (rows 0-7, cols
// 0-3), (8-15, 0-3), (0-7, 4-7), (8-15, 4-7).
template <int PASSES>
__device__ __forceinline__ Tf32A tf32_frag_a_ldm(const float* m, int stride, int m0, int k0) {
    const int lane = threadIdx.x & 31, q = lane >> 3;
    uint32_t r[4];
    ldmatrix_x4(r, smem_addr(m + (m0 + (lane & 7) + 8 * (q & 1)) * stride + k0 + 4 * (q >> 1)));
    return tf32_a_from<PASSES>(r);
}

// The B tiles of columns n0 .. n0 + 7 and n0 + 8 .. n0 + 15, rows k0 .. k0 + 7,
// of a matrix B stored transposed (row n of `bt` holds column n of B, rows
// `stride` floats apart as above), in one ldmatrix.x4.
template <int PASSES>
__device__ __forceinline__ void tf32_frag_b2_ldm(Tf32B (&f)[2], const float* bt, int stride, int n0, int k0) {
    const int lane = threadIdx.x & 31, q = lane >> 3;
    uint32_t r[4];
    ldmatrix_x4(r, smem_addr(bt + (n0 + (lane & 7) + 8 * (q >> 1)) * stride + k0 + 4 * (q & 1)));
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (PASSES == 1) f[t].big[i] = r[2 * t + i];
            else tf32_split(__uint_as_float(r[2 * t + i]), f[t].big[i], f[t].small[i]);
        }
}

// The A tile whose element (r, k) (r < 16, k < 8) is p[r * rs + k * cs]:
// rs = 1 reads a matrix stored transposed (k-major), cs = 1 a row-major one.
__device__ __forceinline__ Tf32A tf32_frag_a(const float* p, int rs, int cs) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    Tf32A f;
    tf32_split(p[g * rs + c * cs], f.big[0], f.small[0]);
    tf32_split(p[(g + 8) * rs + c * cs], f.big[1], f.small[1]);
    tf32_split(p[g * rs + (c + 4) * cs], f.big[2], f.small[2]);
    tf32_split(p[(g + 8) * rs + (c + 4) * cs], f.big[3], f.small[3]);
    return f;
}

// The B tile whose element (k, n) (k < 8, n < 8) is p[k * ks + n * ns].
__device__ __forceinline__ Tf32B tf32_frag_b(const float* p, int ks, int ns) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    Tf32B f;
    tf32_split(p[c * ks + g * ns], f.big[0], f.small[0]);
    tf32_split(p[(c + 4) * ks + g * ns], f.big[1], f.small[1]);
    return f;
}
