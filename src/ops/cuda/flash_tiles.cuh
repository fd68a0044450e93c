// The fused attention kernels' block geometry, tile loads and head-dim dispatch (what of
// flash_common.cuh the kernels need): plain CUDA C++, so tests/cuda_host_sim.h can compile the
// mma.sync kernels that use it for the CPU (tests/test_flash_on_host.cpp). Under that simulation
// VIT_CUDA_HOST_SIM is defined and the shim provides what common.cuh would.
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>

#include "core/common.h"
#include "ops/attention_choice.h"
#ifndef VIT_CUDA_HOST_SIM
#include "ops/cuda/common.cuh"
#endif

namespace vit::cuda::flash {

// Rows a block owns (queries, or keys in the dK/dV kernel): always in the fp32 kernels, at most
// in the mma.sync ones (their launchers may pick blocks of fewer warps: choose_block_warps).
constexpr int kRows = 64;
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

// s (rows, D) shared, row stride D + kVec = g rows [0, valid) (row stride ldg); the rest 0.
// The whole block (`threads` of them) takes part; `vec`: g and ldg allow 16-byte accesses.
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* s, const T* g, int ldg, int valid, bool vec,
                                          int rows = kRows, int threads = kThreads) {
  constexpr int kVec = 16 / int(sizeof(T)), kChunks = D / kVec, ld = kTileLd<T, D>;
  for (int idx = threadIdx.x; idx < rows * kChunks; idx += threads) {
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

// Where a block is: blockIdx.x = (b * H + h) * tiles + tile, a tile `rows` rows.
struct BlockPos {
  int bh, b, h, row0;
  __device__ BlockPos(int H, int tiles, int rows = kRows) {
    bh = blockIdx.x / tiles;
    row0 = (blockIdx.x % tiles) * rows;
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

// The block height for N rows (queries, or keys in the dK/dV kernel) of the mma.sync kernels,
// 1 .. kWarps warps of 16 rows (their launch bound: a bound of 8 warps made ptxas give the
// 4-warp kernels more registers, the dQ kernel's 165 to 178 and so a block less per SM), that
// needs the fewest waves of blocks, given resident(w): how many blocks of w warps an SM holds
// at once (0: none). A block's time hardly depends on w (each warp does the same work over the
// same streamed tiles, and the short rows of ViTs leave the kernels latency-bound), so a head
// costs its blocks, ceil(ceil(N / 16) / w), over the blocks an SM holds. At N = 65 (ViT-Ti/4 at
// 32 px) 4-warp blocks leave a second block per head for one row, which 3-warp ones fill; and
// smaller blocks fit the registers of the dK/dV kernel (226 a thread: 2 blocks of 4 warps an
// SM, 4 of 2). Ties go to fewer blocks (each streams the head's tiles), then to fewer warp
// slots (idle warps past N). Pure host code, tested on the CPU.
template <typename Resident>
int choose_block_warps(Index N, Resident&& resident) {
  const Index warp_rows = (N + 15) / 16;
  int best = 0;
  Index best_blocks = 0, best_resident = 0;
  for (int w = 1; w <= kWarps; ++w) {
    const Index per_sm = resident(w);
    if (per_sm <= 0) continue;
    const Index blocks = (warp_rows + w - 1) / w;
    // the cost blocks / per_sm against the best's (as cross products), then blocks, then slots
    if (best == 0 || std::tuple(blocks * best_resident, blocks, blocks * w) <
                         std::tuple(best_blocks * per_sm, best_blocks, best_blocks * best)) {
      best = w;
      best_blocks = blocks;
      best_resident = per_sm;
    }
  }
  VIT_CHECK(best > 0, "flash attention: no block height fits on this GPU");
  return best;
}

}  // namespace vit::cuda::flash
