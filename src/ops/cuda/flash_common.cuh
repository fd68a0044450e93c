// Shared by the fused attention kernels (flash_attention.cu: fp32; flash_attention_mma.cu:
// mma.sync): block geometry and tile loads (flash_tiles.cuh), and the host-side launch helpers.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/flash_tiles.cuh"

namespace vit::cuda::flash {

// Opts kKernel into `bytes` of dynamic shared memory (above the 48 KB default), once per device,
// kernel and size not yet allowed: a host-side attribute, never enqueued, so it is safe while
// capturing a graph.
template <auto kKernel>
void allow_smem(size_t bytes) {
  static thread_local int done_on = -1;    // the device it was set on
  static thread_local size_t allowed = 0;  // the bytes set there
  int dev = 0;
  VIT_CUDA_CHECK(cudaGetDevice(&dev));
  if (done_on == dev && bytes <= allowed) return;
  VIT_CUDA_CHECK(
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  done_on = dev;
  allowed = bytes;
}

// kKernel<<<grid, 32 warps, bytes>>>(args...) on the op stream, opted into its `bytes` of
// dynamic shared memory first, and checked: every fused attention kernel's launch.
template <auto kKernel, typename... Args>
void launch_flash_warps(unsigned grid, int warps, size_t bytes, Args... args) {
  allow_smem<kKernel>(bytes);
  kKernel<<<grid, unsigned(32 * warps), bytes, stream()>>>(args...);
  VIT_CUDA_LAUNCHED();
}
// The same with kWarps warps (kRows rows), as the fp32 kernels always run.
template <auto kKernel, typename... Args>
void launch_flash(unsigned grid, size_t bytes, Args... args) {
  launch_flash_warps<kKernel>(grid, kWarps, bytes, args...);
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
