// Shared by the fused attention kernels (flash_attention.cu: WMMA and fp32; flash_attention_mma.cu:
// mma.sync): block geometry, tile loads, and the host-side launch helpers.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/attention_choice.h"
#include "ops/cuda/common.cuh"

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

// Opts kKernel into `bytes` of dynamic shared memory (above the 48 KB default), once per device
// and kernel: a host-side attribute, never enqueued, so it is safe while capturing a graph.
template <auto kKernel>
void allow_smem(size_t bytes) {
  static thread_local int done_on = -1;  // the device it was set on
  int dev = 0;
  VIT_CUDA_CHECK(cudaGetDevice(&dev));
  if (done_on == dev) return;
  VIT_CUDA_CHECK(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done_on = dev;
}

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

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Supported head dims, and shapes the kernels' 32-bit index math can hold (checked before any
// launch); returns the number of 64-row tiles.
inline int check_shape(Index B, Index N, Index H, Index D) {
  VIT_CHECK(B >= 1 && N >= 1 && H >= 1, "flash attention: empty shape");
  VIT_CHECK(D == 32 || D == 48 || D == 64 || D == 96,
            "flash attention: head dim " + std::to_string(D) + " not supported (32, 48, 64 or 96)");
  const Index tiles = (N + kRows - 1) / kRows;
  VIT_CHECK(Index(kRows) * 3 * H * D < (Index(1) << 31) && B * H * tiles < (Index(1) << 31),
            "flash attention: shape too large for 32-bit tile indices");
  return int(tiles);
}

}  // namespace vit::cuda::flash
