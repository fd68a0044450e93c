// Shared by the .cu files only: error checks, fp32 <-> storage conversions, warp/block
// reductions, launch sizes, the scratch arena and the instantiation macros.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/common.h"
#include "ops/cuda/ops.h"

namespace vit::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

// Every CUDA runtime call goes through this; failures become a vit::Error naming file:line.
#define VIT_CUDA_CHECK(call)                                              \
  do {                                                                    \
    const cudaError_t vit_err_ = (call);                                  \
    if (vit_err_ != cudaSuccess)                                          \
      ::vit::cuda::throw_cuda_error(vit_err_, #call, __FILE__, __LINE__); \
  } while (0)
// After each kernel launch: catches bad launch configurations at the op that made them.
#define VIT_CUDA_LAUNCHED() VIT_CUDA_CHECK(cudaGetLastError())

// Whether a pointer may be read or written in 16-byte words (null is); tests/cuda_host_sim.h has
// the same for kernels it runs on the CPU.
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
// Whether every one of these pointers is (null ones are).
inline bool all_aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (!aligned16(p)) return false;
  return true;
}

// A kernel's dynamic shared memory (the launch's third argument), 128-byte aligned
// (tests/cuda_host_sim.h has its own for kernels it runs on the CPU).
#define VIT_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]

// Arithmetic is fp32 whatever the storage type.
__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(bf16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

// x stored as To: unchanged when the types match (a copy), else rounded once from fp32 (an
// fp32 residual-stream value stored as a bf16 activation).
template <typename To, typename From>
__device__ __forceinline__ To convert_to(From x) {
  if constexpr (std::is_same_v<To, From>)
    return x;
  else
    return from_f32<To>(to_f32(x));
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of up to 1024 threads; every thread gets the result. `smem` holds 32 A's.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* smem) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int nwarps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < nwarps ? smem[lane] : A(0);
  return warp_sum(v);
}

// Grid-stride loop over i in [0, n) (n may exceed 2^31: the index is 64-bit).
#define VIT_GRID_STRIDE(i, n)                                                         \
  for (::vit::Index i = blockIdx.x * ::vit::Index(blockDim.x) + threadIdx.x; i < (n); \
       i += ::vit::Index(gridDim.x) * blockDim.x)

constexpr int kBlock = 256;  // default threads per block for elementwise kernels

inline unsigned blocks_for(Index n, int block = kBlock) {
  const Index b = (n + block - 1) / block;
  return unsigned(b < 1 ? 1 : b);
}
// Grid for grid-stride loops: enough blocks to fill the GPU, no more.
unsigned grid_stride_blocks(Index n, int block = kBlock);
int num_sms();

// Scratch buffer `slot` (see ScratchSlot in ops.h) of at least `bytes`, for ops on stream().
// The buffer stays allocated at least until release_scratch() (also after the slot grows), but
// its contents belong to the next op that asks for the same slot.
void* scratch(size_t bytes, int slot);

// out (C) += column sums of f(r, c) over r < R, in fp32. Deterministic: fixed row chunks per
// block, partials summed in chunk order (no atomics), so reruns give the same bits.
template <typename F>
__global__ void colsum_partial_kernel(float* partial, F f, Index R, Index C, Index rows_per_chunk) {
  // partial (chunks, C); block (32, 8): x walks columns (coalesced), y interleaves rows
  __shared__ float sm[8][33];
  const Index c = blockIdx.x * Index(32) + threadIdx.x;
  const Index r0 = blockIdx.y * rows_per_chunk;
  const Index r1 = r0 + rows_per_chunk < R ? r0 + rows_per_chunk : R;
  float acc = 0.0f;
  if (c < C)
    for (Index r = r0 + threadIdx.y; r < r1; r += 8) acc += f(r, c);
  sm[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.0f;
    for (int y = 0; y < 8; ++y) s += sm[y][threadIdx.x];
    partial[blockIdx.y * C + c] = s;
  }
}

template <typename A = float>
__global__ void colsum_finish_kernel(A* out, const A* partial, Index chunks, Index C) {
  // out (C) += sum over chunks of partial (chunks, C)
  const Index c = blockIdx.x * Index(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  A s = A(0);
  for (Index k = 0; k < chunks; ++k) s += partial[k * C + c];
  out[c] += s;
}

// The row chunks of a column sum whose columns are split into `col_blocks` blocks: about 4
// blocks per SM in all, each chunk at least 64 rows. Fixed for a shape, so sums are
// deterministic.
struct ColsumChunks {
  Index chunks, rows_per_chunk;
};
inline ColsumChunks colsum_chunks(Index R, Index col_blocks) {
  Index chunks = (4 * Index(num_sms()) + col_blocks - 1) / col_blocks;
  chunks = chunks < (R + 63) / 64 ? chunks : (R + 63) / 64;
  chunks = chunks < 1 ? 1 : (chunks > 65535 ? 65535 : chunks);
  return {chunks, (R + chunks - 1) / chunks};
}

template <typename F>
void colsum_accumulate(float* out, F f, Index R, Index C) {
  if (R <= 0 || C <= 0) return;
  const Index col_blocks = (C + 31) / 32;
  const auto [chunks, rows_per_chunk] = colsum_chunks(R, col_blocks);
  auto* partial = static_cast<float*>(scratch(size_t(chunks * C) * sizeof(float), kScratchColsum));
  colsum_partial_kernel<<<dim3(unsigned(col_blocks), unsigned(chunks)), dim3(32, 8), 0, stream()>>>(
      partial, f, R, C, rows_per_chunk);
  VIT_CUDA_LAUNCHED();
  colsum_finish_kernel<float><<<blocks_for(C), kBlock, 0, stream()>>>(out, partial, chunks, C);
  VIT_CUDA_LAUNCHED();
}

// Explicit instantiation of an op for the storage types.
#define VIT_CUDA_INSTANTIATE(MACRO) \
  MACRO(float)                      \
  MACRO(::vit::cuda::bf16)
// The ops on the residual stream, MACRO(T, X): activations T, stream X (ops.h): fp32, bf16, and
// bf16 with the fp32 stream of --fp32-residual.
#define VIT_CUDA_INSTANTIATE_STREAM(MACRO)    \
  MACRO(float, float)                         \
  MACRO(::vit::cuda::bf16, ::vit::cuda::bf16) \
  MACRO(::vit::cuda::bf16, float)

}  // namespace vit::cuda
