// Shared helpers for kestrel kernels: reductions and bf16 conversion.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#define KESTREL_EXTERN extern "C" __global__

// Programmatic dependent launch. Kernels are launched so that their blocks may
// be scheduled while the previous kernel on the stream still runs. Every
// kernel calls pdl_begin() (or pdl_launch_dependents() and later pdl_wait())
// before it touches any global memory that another kernel writes or reads:
// pdl_launch_dependents() first lets the next kernel be scheduled as soon as
// all of this kernel's blocks are resident (the next kernel still waits for
// this one to finish in its own pdl_wait(), so ordering is unchanged), and
// pdl_wait() then waits until the previous kernel has finished and its writes
// are visible. Only memory no kernel ever writes (weights) may be read before
// pdl_wait(): that is how a GEMV streams its first weights while its
// predecessor is still finishing. Without the launch attribute both are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
    pdl_launch_dependents();
    pdl_wait();
}

// A shared-memory pointer as the 32-bit address PTX takes.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// acc + (v.x^2 + v.y^2 + v.z^2 + v.w^2), with every rounding spelled out: the
// norm kernels and the norm that gemv_norm computes itself must form the same
// sums bit for bit (a decode row and a verify row of the same token take
// different ones), which leaves no contraction to the compiler.
__device__ __forceinline__ float sum_sq4(float acc, float4 v) {
    float s = __fmul_rn(v.x, v.x);
    s = __fmaf_rn(v.y, v.y, s);
    s = __fmaf_rn(v.z, v.z, s);
    s = __fmaf_rn(v.w, v.w, s);
    return __fadd_rn(acc, s);
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024).
// `scratch` holds 32 floats; the result is returned to every thread.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int nwarps = (blockDim.x + 31) >> 5;
    v = lane < nwarps ? scratch[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int nwarps = (blockDim.x + 31) >> 5;
    v = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

__device__ __forceinline__ float bf16_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ __nv_bfloat16 f32_to_bf16(float v) { return __float2bfloat16_rn(v); }
// Two f32 as a bf16 pair, `lo` in the low half (each rounded as f32_to_bf16).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float sigmoidf_exact(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float siluf_exact(float x) { return x / (1.f + expf(-x)); }
