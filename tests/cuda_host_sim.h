// Runs the source of simple CUDA kernels on the CPU, so CI (which has no GPU) checks their
// indexing, their rounding and their block-level reductions: a kernel header written for it
// (ops/cuda/dwconv_kernels.cuh) is included after this one, which stands in for common.cuh and
// the CUDA built-ins. `launch` runs the blocks one after another and each block's threads as
// std::threads, with a barrier for __syncthreads, so shared memory (a static array here: one
// block at a time uses it) and the order of a block's reduction behave as on the device. Only
// for kernels that use no warp intrinsics, atomics or tensor-core instructions.
#pragma once
#define VIT_CUDA_HOST_SIM 1

#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/common.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static  // one block runs at a time
#define __launch_bounds__(...)

struct SimDim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local SimDim3 threadIdx, blockIdx;
inline SimDim3 blockDim, gridDim;

namespace vit::cuda {

using bf16 = ::vit::bf16;  // the host bf16 rounds as __float2bfloat16_rn

inline std::barrier<>* sim_block_barrier = nullptr;
inline void __syncthreads() {
  sim_block_barrier->arrive_and_wait();
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline int min(int a, int b) {
  return a < b ? a : b;
}

inline float to_f32(float x) {
  return x;
}
inline float to_f32(bf16 x) {
  return float(x);
}
template <typename T>
T from_f32(float x);
template <>
inline float from_f32<float>(float x) {
  return x;
}
template <>
inline bf16 from_f32<bf16>(float x) {
  return bf16(x);
}

#define VIT_GRID_STRIDE(i, n)                                                         \
  for (::vit::Index i = blockIdx.x * ::vit::Index(blockDim.x) + threadIdx.x; i < (n); \
       i += ::vit::Index(gridDim.x) * blockDim.x)

// kernel<<<grid, block>>>(...) as `launch(grid, block, [&] { kernel(...); })`.
template <typename F>
void launch(SimDim3 grid, SimDim3 block, F body) {
  gridDim = grid;
  blockDim = block;
  const unsigned threads = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> barrier(threads);
        sim_block_barrier = &barrier;
        std::vector<std::thread> team;
        team.reserve(threads);
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx)
              team.emplace_back([=, &body] {
                threadIdx = {tx, ty, tz};
                blockIdx = {bx, by, bz};
                body();
              });
        for (std::thread& t : team) t.join();
        sim_block_barrier = nullptr;
      }
}

}  // namespace vit::cuda
