// The classifier pooling's backward over 8-column chunks (pool.cu launches it where C and the
// pointers allow, else its one-thread-an-element kernel). That kernel paid three 64-bit index
// divisions an element: 68 us of a ViT-Ti/4 b1024 step (average pooling, sixth runs' profile,
// H200), where its bytes take ~12. Here a thread adds one chunk of dout to one chunk of dx,
// dividing twice a chunk in 32-bit indices (the launcher keeps the count under 2^30), with the
// same formula a value, so the same bits.
//
// Plain CUDA C++, so that tests/cuda_host_sim.h compiles it for the CPU
// (tests/test_pool_on_host.cpp).
#pragma once

#ifndef VIT_CUDA_HOST_SIM
#include "ops/cuda/common.cuh"
#endif
#include "ops/cuda/chunk.cuh"

namespace vit::cuda::pool_kernels {

// dx (B, N, C) rows [first, first + rows) of every sample += dout (B, C) * inv: the class token
// (first 0, rows 1, inv 1) or the mean of the patch tokens (first = prefix, rows = N - prefix,
// inv = 1 / rows). One thread a chunk; chunks = B * rows * C / kChunk (< 2^30), C a multiple of
// kChunk, dx and dout 16-byte aligned.
template <typename T>
__global__ void pool_backward_chunks_kernel(T* dx, const T* dout, int N, int C, int first, int rows,
                                            int chunks, float inv) {
  // dx (B, N, C) accumulates, dout (B, C)
  const int per_row = C / kChunk;
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < chunks;
       i += int(gridDim.x * blockDim.x)) {
    const int r = i / per_row, c = (i - r * per_row) * kChunk;  // r: the (sample, row) pair
    const int b = r / rows, n = first + (r - b * rows);
    T* d = dx + (Index(b) * N + n) * C + c;
    Chunk<T> x = load_chunk(d);
    const Chunk<T> g = load_chunk(dout + Index(b) * C + c);
#pragma unroll
    for (int e = 0; e < kChunk; ++e) x.v[e] = from_f32<T>(to_f32(x.v[e]) + to_f32(g.v[e]) * inv);
    store_chunk(d, x);
  }
}

}  // namespace vit::cuda::pool_kernels
