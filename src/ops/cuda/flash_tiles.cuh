// The fused attention kernels' block geometry, tile loads and head-dim dispatch (what of
// flash_common.cuh the kernels need): plain CUDA C++, so tests/cuda_host_sim.h can compile the
// mma.sync kernels that use it for the CPU (tests/test_flash_on_host.cpp). Under that simulation
// VIT_CUDA_HOST_SIM is defined and the shim provides what common.cuh would.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/common.h"
#include "ops/attention_choice.h"
#ifndef VIT_CUDA_HOST_SIM
#include "ops/cuda/common.cuh"
// A kernel's dynamic shared memory (the launch's third argument), 128-byte aligned.
#define VIT_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace vit::cuda::flash {

constexpr int kRows = 64;  // rows a block owns (queries, or keys in the dK/dV kernel)
// Rows of the streamed tiles (keys, or queries in the dK/dV kernel); the online softmax
// rescales at their boundaries, and the CPU emulation walks the same tiles.
constexpr int kCols = int(kFlashTile);
constexpr int kWarps = kRows / 16;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory row stride (elements) of a (kRows, D) tile: 16 bytes of padding keep rows
// 16-byte multiples and shift banks from row to row.
template <typename T, int D>
constexpr int kTileLd = D + 16 / int(sizeof(T));

template <typename T>
__device__ __forceinline__ T zero_of() {
  return from_f32<T>(0.0f);
}

// s (kRows, D) shared, row stride D + kVec = g rows [0, valid) (row stride ldg); the rest 0.
// The whole block takes part; `vec`: g and ldg allow 16-byte accesses.
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* s, const T* g, int ldg, int valid, bool vec) {
  constexpr int kVec = 16 / int(sizeof(T)), kChunks = D / kVec, ld = kTileLd<T, D>;
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * kVec;
    T* dst = s + r * ld + c;
    if (vec) {
      uint4 x = make_uint4(0u, 0u, 0u, 0u);
      if (r < valid) x = *reinterpret_cast<const uint4*>(g + r * ldg + c);
      *reinterpret_cast<uint4*>(dst) = x;
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) dst[e] = r < valid ? g[r * ldg + c + e] : zero_of<T>();
    }
  }
}

// Where a block is: blockIdx.x = (b * H + h) * tiles + tile.
struct BlockPos {
  int bh, b, h, row0;
  __device__ BlockPos(int H, int tiles) {
    bh = blockIdx.x / tiles;
    row0 = (blockIdx.x % tiles) * kRows;
    b = bh / H;
    h = bh % H;
  }
};

// Calls f(std::integral_constant<int, D>) for the supported head dims.
template <typename F>
void with_head_dim(Index D, F&& f) {
  switch (D) {
    case 32:
      return f(std::integral_constant<int, 32>());
    case 48:
      return f(std::integral_constant<int, 48>());
    case 64:
      return f(std::integral_constant<int, 64>());
    case 96:
      return f(std::integral_constant<int, 96>());
    default:
      VIT_CHECK(false, "flash attention: head dim " + std::to_string(D) + " not supported");
  }
}

}  // namespace vit::cuda::flash
