// A/B of decode-time gemv variants against the production kernels, at
// Qwen3.6-35B-A3B's dense shapes with the K split a verify step uses (the
// split of one row per sequence). Every variant must give the production
// kernel's bits. Build: nvcc -O3 -arch=sm_90a -std=c++17 -I KERNELS bench.cu
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstring>
#include <cuda_runtime.h>

#include "gemv.cu"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

// The production body (gemv_body, not NORM) with rows per warp R, chunks
// in flight U and the loads-ahead loop on or off.
template <int M, int R, int U, typename WT, bool AHEAD>
__global__ void __launch_bounds__(256, 1)
    gemv_t(float* __restrict__ y, const float* __restrict__ x, const void* __restrict__ w, int n_rows, int k,
           int split, const float* __restrict__ scales) {
    gemv_body<M, R, U, WT, false, AHEAD>(y, x, w, nullptr, n_rows, k, split, nullptr, scales);
}

__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        float v = ((h & 0xffff) / 65536.f - 0.5f) * 0.1f;
        p[i] = (uint16_t)(__float_as_uint(v) >> 16);
    }
}

struct Shape { const char* name; int n, k; };

// The split gemv_split picks for one row per sequence (rows per warp 2).
static int split_for(int n, int k, int elems) {
    int groups = (n + 1) / 2, target = 2048, split = 1;
    while (split < 8 && groups * split < target && k / (elems * 32 * 2 * split) >= 1) split *= 2;
    return split;
}

typedef void (*Kern)(float*, const float*, const uint16_t*, const uint16_t*, int, int, int);
typedef void (*Kern8)(float*, const float*, const uint8_t*, const float*, int, int, int);
typedef void (*VKern)(float*, const float*, const void*, int, int, int, const float*);

struct Variant {
    const char* name;
    int m, r;
    Kern prod;   // production kernel, or null
    Kern8 prod8;
    VKern var;
    bool stage, persistent, fp8;
};

__global__ void fill_fp8(uint8_t* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        p[i] = (uint8_t)(h & 0xb7);  // never the NaN codes
    }
}
__global__ void fill_f32(float* p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = 0.001f * (1 + (i % 7));
}

#define V16(name, m, r, prod, var, stage, persist) {name, m, r, prod, nullptr, (VKern)(var), stage, persist, false}
#define V8(name, m, r, prod, var, stage, persist) {name, m, r, nullptr, prod, (VKern)(var), stage, persist, true}

int main(int argc, char** argv) {
    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    {
        void *a, *b;
        const size_t n = 2ull << 30;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        cudaEvent_t c0, c1;
        CK(cudaEventCreate(&c0));
        CK(cudaEventCreate(&c1));
        std::vector<float> t;
        for (int i = 0; i < 6; ++i) {
            CK(cudaEventRecord(c0));
            CK(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(c1));
            CK(cudaEventSynchronize(c1));
            float ms;
            CK(cudaEventElapsedTime(&ms, c0, c1));
            if (i) t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        printf("copy bandwidth (read + write) %.0f GB/s\n", 2.0 * n / (t[2] * 1e6));
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    const Shape shapes[] = {{"gdn_in_proj", 12352, 2048}, {"gdn_out_proj", 2048, 4096}, {"attn_qkv", 9216, 2048},
                            {"attn_o", 2048, 4096},       {"router", 257, 2048},        {"lm_head", 248320, 2048}};
    const Variant variants[] = {
        V16("m1 prod R2U4", 1, 2, gemv_m1, nullptr, false, false),
        V16("m1 t R2U4", 1, 2, nullptr, (gemv_t<1, 2, 4, Bf16W, false>), false, false),
        V16("m1 ahead R2U4", 1, 2, nullptr, (gemv_t<1, 2, 4, Bf16W, true>), false, false),
        V16("m1 ahead R2U2", 1, 2, nullptr, (gemv_t<1, 2, 2, Bf16W, true>), false, false),
        V16("m1 ahead R2U3", 1, 2, nullptr, (gemv_t<1, 2, 3, Bf16W, true>), false, false),
        V16("m1 ahead R4U2", 1, 4, nullptr, (gemv_t<1, 4, 2, Bf16W, true>), false, false),
        V16("m1 ahead R1U4", 1, 1, nullptr, (gemv_t<1, 1, 4, Bf16W, true>), false, false),
        V16("m2 prod R4U2", 2, 4, gemv_m2, nullptr, false, false),
        V16("m2 ahead R4U2", 2, 4, nullptr, (gemv_t<2, 4, 2, Bf16W, true>), false, false),
        V16("m2 ahead R4U1", 2, 4, nullptr, (gemv_t<2, 4, 1, Bf16W, true>), false, false),
        V16("m2 ahead R2U2", 2, 2, nullptr, (gemv_t<2, 2, 2, Bf16W, true>), false, false),
        V16("m4 prod R4U2", 4, 4, gemv_m4, nullptr, false, false),
        V16("m4 t R4U2", 4, 4, nullptr, (gemv_t<4, 4, 2, Bf16W, false>), false, false),
        V16("m4 ahead R4U2", 4, 4, nullptr, (gemv_t<4, 4, 2, Bf16W, true>), false, false),
        V16("m4 ahead R4U1", 4, 4, nullptr, (gemv_t<4, 4, 1, Bf16W, true>), false, false),
        V16("m4 ahead R2U2", 4, 2, nullptr, (gemv_t<4, 2, 2, Bf16W, true>), false, false),
        V16("m4 ahead R2U1", 4, 2, nullptr, (gemv_t<4, 2, 1, Bf16W, true>), false, false),
        V16("m8 prod R8U2", 8, 8, gemv_m8, nullptr, false, false),
        V16("m8 ahead R8U1", 8, 8, nullptr, (gemv_t<8, 8, 1, Bf16W, true>), false, false),
        V16("m8 ahead R4U1", 8, 4, nullptr, (gemv_t<8, 4, 1, Bf16W, true>), false, false),
        V16("m8 ahead R4U2", 8, 4, nullptr, (gemv_t<8, 4, 2, Bf16W, true>), false, false),
        V8("fp8 m1 prod R2U4", 1, 2, gemv_fp8_m1, nullptr, false, false),
        V8("fp8 m1 ahead R2U4", 1, 2, nullptr, (gemv_t<1, 2, 4, Fp8W, true>), false, false),
        V8("fp8 m1 ahead R2U2", 1, 2, nullptr, (gemv_t<1, 2, 2, Fp8W, true>), false, false),
        V8("fp8 m1 ahead R4U1", 1, 4, nullptr, (gemv_t<1, 4, 1, Fp8W, true>), false, false),
        V8("fp8 m1 t R4U2", 1, 4, nullptr, (gemv_t<1, 4, 2, Fp8W, false>), false, false),
        V8("fp8 m4 prod R4U2", 4, 4, gemv_fp8_m4, nullptr, false, false),
        V8("fp8 m4 ahead R4U1", 4, 4, nullptr, (gemv_t<4, 4, 1, Fp8W, true>), false, false),
        V8("fp8 m4 ahead R2U2", 4, 2, nullptr, (gemv_t<4, 2, 2, Fp8W, true>), false, false),
        V8("fp8 m4 ahead R2U1", 4, 2, nullptr, (gemv_t<4, 2, 1, Fp8W, true>), false, false),
        V8("fp8 m8 prod R6U1", 8, 6, gemv_fp8_m8, nullptr, false, false),
        V8("fp8 m8 ahead R6U1", 8, 6, nullptr, (gemv_t<8, 6, 1, Fp8W, true>), false, false),
        V8("fp8 m8 ahead R4U1", 8, 4, nullptr, (gemv_t<8, 4, 1, Fp8W, true>), false, false),
    };
    const size_t WORKING = 768ull << 20;
    float *x, *y, *scales;
    CK(cudaMalloc(&x, 16 * 4096 * 4));
    CK(cudaMalloc(&y, 8ull * 248320 * 4));
    CK(cudaMalloc(&scales, (248320 / 128 + 1) * 32 * 4));
    fill_f32<<<64, 256>>>(scales, (248320 / 128 + 1) * 32);
    {
        std::vector<float> hx(16 * 4096);
        for (size_t i = 0; i < hx.size(); ++i) hx[i] = ((i * 7919) % 2001) / 1000.f - 1.f;
        CK(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int fp8 = 0; fp8 < 2; ++fp8)
    for (const Shape& sh : shapes) {
        const int elems = fp8 ? 16 : 8;
        const size_t bytes = (size_t)sh.n * sh.k * (fp8 ? 1 : 2);
        const int copies = (int)std::min<size_t>(32, std::max<size_t>(2, (WORKING + bytes - 1) / bytes));
        std::vector<void*> ws(copies);
        for (int c = 0; c < copies; ++c) {
            CK(cudaMalloc(&ws[c], bytes));
            if (fp8) fill_fp8<<<1024, 256>>>((uint8_t*)ws[c], bytes, 1234 + c);
            else fill_bf16<<<1024, 256>>>((uint16_t*)ws[c], bytes / 2, 1234 + c);
        }
        CK(cudaDeviceSynchronize());
        const int split = split_for(sh.n, sh.k, elems);
        printf("\n%s %s N=%d K=%d split=%d (%.1f MB)\n", fp8 ? "fp8" : "bf16", sh.name, sh.n, sh.k, split, bytes / 1e6);
        std::vector<float> ref_host;
        int ref_m = -1;
        for (const Variant& v : variants) {
            if (v.fp8 != (bool)fp8) continue;
            const int rows_per_block = (8 / split) * v.r;
            const int block_groups = (sh.n + rows_per_block - 1) / rows_per_block;
            size_t smem = v.stage ? (size_t)v.m * sh.k * 4 : 0;
            int grid = block_groups;
            if (v.var) {
                CK(cudaFuncSetAttribute((const void*)v.var, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
                if (v.persistent) {
                    int per_sm = 0;
                    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void*)v.var, 256, smem));
                    grid = std::min(block_groups, per_sm * prop.multiProcessorCount);
                }
            }
            auto launch = [&](int c) {
                if (v.prod) v.prod<<<grid, 256>>>(y, x, (const uint16_t*)ws[c], nullptr, sh.n, sh.k, split);
                else if (v.prod8) v.prod8<<<grid, 256>>>(y, x, (const uint8_t*)ws[c], scales, sh.n, sh.k, split);
                else v.var<<<grid, 256, smem>>>(y, x, ws[c], sh.n, sh.k, split, scales);
            };
            launch(0);
            CK(cudaDeviceSynchronize());
            std::vector<float> out((size_t)v.m * sh.n);
            CK(cudaMemcpy(out.data(), y, out.size() * 4, cudaMemcpyDeviceToHost));
            const char* check = "ref";
            if (v.prod || v.prod8) {
                ref_host = out;
                ref_m = v.m;
            } else if (ref_m == v.m) {
                check = memcmp(out.data(), ref_host.data(), out.size() * 4) == 0 ? "same bits" : "DIFFERENT";
            }
            for (int i = 0; i < 2 * copies; ++i) launch(i % copies);
            std::vector<float> t;
            const int reps = 100;
            for (int round = 0; round < 5; ++round) {
                CK(cudaEventRecord(e0));
                for (int i = 0; i < reps; ++i) launch(i % copies);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms * 1000.f / reps);
            }
            std::sort(t.begin(), t.end());
            const float us = t[2];
            cudaFuncAttributes fa;
            CK(cudaFuncGetAttributes(&fa, v.prod ? (const void*)v.prod : v.prod8 ? (const void*)v.prod8 : (const void*)v.var));
            printf("  %-26s regs %3d grid %6d smem %6zu  %8.2f us  %7.0f GB/s  (min %.2f max %.2f)  %s\n", v.name,
                   fa.numRegs, grid, smem, us, bytes / (us * 1e3), t[0], t[4], check);
        }
        for (auto p : ws) CK(cudaFree(p));
    }
    return 0;
}
