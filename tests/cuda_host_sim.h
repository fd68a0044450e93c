// Runs the source of CUDA kernels on the CPU, so CI (which has no GPU) checks their indexing,
// their rounding and their block-level reductions: a kernel header written for it
// (ops/cuda/dwconv_kernels.cuh, ops/cuda/flash_mma_kernels.cuh) is included after this one,
// which stands in for common.cuh and the CUDA built-ins. `launch` runs the blocks one after
// another and each block's threads as std::threads, with a barrier for __syncthreads, so shared
// memory (a static array, or the launch's dynamic bytes: one block at a time uses them) and
// the order of a block's reduction behave as on the device. Warp intrinsics (shuffles here; the
// tensor-core and cp.async instructions in cuda_host_sim_mma.h) meet at a barrier of the
// warp's threads and exchange their registers through its slots. No atomics.
#pragma once
#define VIT_CUDA_HOST_SIM 1

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/bf16.h"
#include "core/common.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static  // one block runs at a time
#define __launch_bounds__(...)
#define __maxnreg__(...)
// The launch's dynamic shared memory (`bytes` of launch()), 128-byte aligned.
#define VIT_DYNAMIC_SHARED(name) unsigned char* name = ::vit::cuda::sim_dynamic_shared

struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return {x, y, z, w};
}
struct alignas(8) uint2 {
  unsigned x, y;
};

struct SimDim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local SimDim3 threadIdx, blockIdx;
inline SimDim3 blockDim, gridDim;

namespace vit::cuda {

using bf16 = ::vit::bf16;  // the host bf16 rounds as __float2bfloat16_rn

inline std::barrier<>* sim_block_barrier = nullptr;
inline unsigned char* sim_dynamic_shared = nullptr;
inline void __syncthreads() {
  sim_block_barrier->arrive_and_wait();
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline float __fmul_rn(float a, float b) {  // the test is built with -ffp-contract=off
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fdividef(float a, float b) {  // the device's is approximate (2 ulps)
  return a / b;
}

// A warp's threads: their barrier, and a slot of words per lane for what they exchange.
struct SimWarp {
  explicit SimWarp(std::ptrdiff_t threads) : barrier(threads) {}
  std::barrier<> barrier;
  uint64_t slot[32][8] = {};
};
inline std::deque<SimWarp>* sim_warps = nullptr;  // the running block's (a barrier cannot move)

inline unsigned sim_thread_in_block() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
inline int sim_lane() {
  return int(sim_thread_in_block() % 32);
}

// Every lane of the warp publishes its words, then `read(slot)` runs in each once all have;
// the second barrier keeps the slots until every lane has read them.
template <typename Read>
void sim_warp_exchange(std::initializer_list<uint64_t> mine, Read&& read) {
  SimWarp& w = (*sim_warps)[sim_thread_in_block() / 32];
  uint64_t* own = w.slot[sim_lane()];
  for (uint64_t v : mine) *own++ = v;
  w.barrier.arrive_and_wait();
  read(w.slot);
  w.barrier.arrive_and_wait();
}

// v of lane `src(this lane)`, for every lane of a full warp (the mask is not modelled).
template <typename T, typename Src>
T sim_shuffle(T v, Src src) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  T out;
  sim_warp_exchange({bits}, [&](const uint64_t(&slot)[32][8]) {
    std::memcpy(&out, &slot[src(sim_lane())][0], sizeof out);
  });
  return out;
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return sim_shuffle(v, [=](int lane) { return lane ^ lane_mask; });
}
template <typename T>
T __shfl_sync(unsigned, T v, int src_lane) {
  return sim_shuffle(v, [=](int) { return src_lane; });
}
inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a < b ? b : a;
}

inline bool aligned16(const void* p) {  // common.cuh's
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
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

// kernel<<<grid, block, bytes>>>(...) as `launch(grid, block, bytes, [&] { kernel(...); })`.
// The dynamic shared memory starts as 0x7f bytes (bf16 and fp32 values near their largest), so a
// kernel that reads what it never wrote shows in its results.
template <typename F>
void launch(SimDim3 grid, SimDim3 block, size_t bytes, F body) {
  gridDim = grid;
  blockDim = block;
  const unsigned threads = block.x * block.y * block.z;
  const size_t padded = (bytes + 127) / 128 * 128;
  std::vector<unsigned char> storage(padded + 128);
  unsigned char* shared =
      storage.data() + (128 - reinterpret_cast<uintptr_t>(storage.data()) % 128);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> barrier(threads);
        std::deque<SimWarp> warps;
        for (unsigned t = 0; t < threads; t += 32) warps.emplace_back(std::min(32u, threads - t));
        std::memset(shared, 0x7f, padded);
        sim_block_barrier = &barrier;
        sim_warps = &warps;
        sim_dynamic_shared = bytes > 0 ? shared : nullptr;
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
        sim_warps = nullptr;
        sim_dynamic_shared = nullptr;
      }
}
template <typename F>
void launch(SimDim3 grid, SimDim3 block, F body) {
  launch(grid, block, 0, std::move(body));
}

}  // namespace vit::cuda
