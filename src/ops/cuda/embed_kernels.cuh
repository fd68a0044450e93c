// The patch embedding's copies and the token assembly over wide words (embed.cu launches them
// where shapes and pointers allow, else its one-thread-an-element kernels). Those spent their
// time on 64-bit index division, several an element: the sixth runs' profile (H200, ViT-S/16
// b256) had im2patches at 378 us, the token assembly at 117 and its backward at 171, where their
// bytes take ~32, ~24 and ~16 us at the H200's bandwidth. Here a thread moves a run of values
// and divides once a run, in 32-bit indices (the launcher checks the shapes fit).
//
// Plain CUDA C++ (no warp intrinsics), so that tests/cuda_host_sim.h compiles it for the CPU
// (tests/test_embed_on_host.cpp).
#pragma once
#include <cstdint>
#include <cstdlib>

#ifndef VIT_CUDA_HOST_SIM
#include "ops/cuda/common.cuh"
#endif
#include "ops/cuda/chunk.cuh"

namespace vit::cuda::embed_kernels {

// A run of P values of T copied as words of kWord bytes (16, 8 or 4: uint4, uint2, unsigned).
template <int kWord>
struct WordOf;
template <>
struct WordOf<16> {
  using type = uint4;
};
template <>
struct WordOf<8> {
  using type = uint2;
};
template <>
struct WordOf<4> {
  using type = unsigned;
};

// img (B, Cin, Himg, Wimg) -> patches (B, gh * gw, Cin * P * P), each patch's values in (c, ph,
// pw) order. One thread a run: the P values of patch row ph of channel c, contiguous in both
// tensors, at patches[s * P] for run s = ((b * gh * gw + p) * Cin + c) * P + ph. runs: their
// count (< 2^31); P * sizeof(T), Wimg * sizeof(T) and both pointers kWord-aligned.
template <typename T, int kWord>
__global__ void im2patches_runs_kernel(T* patches, const T* img, int runs, int Cin, int Himg,
                                       int Wimg, int P) {
  using Word = typename WordOf<kWord>::type;
  const int gw = Wimg / P, grid = (Himg / P) * gw, words = P * int(sizeof(T)) / kWord;
  VIT_GRID_STRIDE(i, runs) {
    const int s = int(i), ph = s % P, t = s / P, c = t % Cin, q = t / Cin;
    const int p = q % grid, b = q / grid, py = p / gw, px = p % gw;
    const T* src = img + ((int64_t(b) * Cin + c) * Himg + py * P + ph) * Wimg + px * P;
    T* dst = patches + int64_t(s) * P;
#ifdef VIT_CUDA_HOST_SIM
    if (reinterpret_cast<uintptr_t>(src) % kWord || reinterpret_cast<uintptr_t>(dst) % kWord)
      std::abort();  // the device would fault
#endif
    const Word* from = reinterpret_cast<const Word*>(src);
    Word* to = reinterpret_cast<Word*>(dst);
    for (int w = 0; w < words; ++w) to[w] = from[w];
  }
}

// x (B, N, C) in X = [cls rows | patch_out rows] + pos; patch_out (B, N - prefix, C), cls
// (prefix rows of C: the class token, one row), pos (N, C). One thread a chunk of 8 columns of a
// row; chunks: B * N * C / 8 (< 2^31), C a multiple of 8, every pointer 16-byte aligned. The
// sum and its rounding are the elementwise kernel's, so the bits are too.
template <typename T, typename X>
__global__ void embed_tokens_forward_chunks_kernel(X* x, const T* patch_out, const T* cls,
                                                   const T* pos, int chunks, int N, int prefix,
                                                   int C) {
  const int per_row = C / kChunk;
  VIT_GRID_STRIDE(i, chunks) {
    const int k = int(i), r = k / per_row, col = (k % per_row) * kChunk, n = r % N, b = r / N;
    const T* src_row = n < prefix ? cls + int64_t(n) * C
                                  : patch_out + (int64_t(b) * (N - prefix) + n - prefix) * C;
    const Chunk<T> src = load_chunk(src_row + col), add = load_chunk(pos + int64_t(n) * C + col);
    Chunk<X> out;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) out.v[e] = from_f32<X>(to_f32(src.v[e]) + to_f32(add.v[e]));
    store_chunk(x + int64_t(r) * C + col, out);
  }
}

// dpatch_out (B, N - prefix, C) = the patch rows of dx (B, N, C) in X, rounded to T. One thread
// a chunk; chunks: B * (N - prefix) * C / 8 (< 2^31), C a multiple of 8, pointers 16-byte aligned.
template <typename T, typename X>
__global__ void embed_dpatch_chunks_kernel(T* dpatch_out, const X* dx, int chunks, int N,
                                           int prefix, int C) {
  const int per_row = C / kChunk, Np = N - prefix;
  VIT_GRID_STRIDE(i, chunks) {
    const int k = int(i), r = k / per_row, col = (k % per_row) * kChunk, b = r / Np, p = r % Np;
    const Chunk<X> in = load_chunk(dx + (int64_t(b) * N + prefix + p) * C + col);
    Chunk<T> out;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) out.v[e] = from_f32<T>(to_f32(in.v[e]));
    store_chunk(dpatch_out + int64_t(r) * C + col, out);
  }
}

// dpos (N, C) += the sum over b of dx (B, N, C) in X. The one-thread-a-column kernel had N * C
// threads (75,648 at ViT-S/16) walking all B rows; here a block's kDposSlices x 32 threads take
// 32 chunks of (n, c) and slices of the batch (b = slice, slice + kDposSlices, ...), then the
// first 32 add the slices' partial sums in slice order: a fixed order, so reruns give the same
// bits (not the elementwise kernel's: its sum runs over b in order). Block: 32 * kDposSlices
// threads; grid: ceil(N * C / 8 / 32) blocks; C a multiple of 8, dx 16-byte aligned.
constexpr int kDposSlices = 8;
constexpr int kDposThreads = 32 * kDposSlices;
template <typename X>
__global__ void embed_dpos_chunks_kernel(float* dpos, const X* dx, int B, int N, int C) {
  __shared__ float partial[kDposSlices][32][kChunk];  // (slice, chunk of the block, column)
  const int lane = int(threadIdx.x) % 32, slice = int(threadIdx.x) / 32;
  const int chunks = N * C / kChunk, k = int(blockIdx.x) * 32 + lane;
  float sum[kChunk] = {};
  if (k < chunks)
    for (int b = slice; b < B; b += kDposSlices) {
      const Chunk<X> v = load_chunk(dx + int64_t(b) * N * C + int64_t(k) * kChunk);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) sum[e] += to_f32(v.v[e]);
    }
#pragma unroll
  for (int e = 0; e < kChunk; ++e) partial[slice][lane][e] = sum[e];
  __syncthreads();
  if (slice != 0 || k >= chunks) return;
  float* out = dpos + int64_t(k) * kChunk;
#pragma unroll
  for (int e = 0; e < kChunk; ++e) {
    float s = partial[0][lane][e];
    for (int j = 1; j < kDposSlices; ++j) s += partial[j][lane][e];
    out[e] += s;
  }
}

}  // namespace vit::cuda::embed_kernels
