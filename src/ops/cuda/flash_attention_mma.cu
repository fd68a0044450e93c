// Launches the mma.sync fused attention kernels of flash_mma_kernels.cuh (the scheme, the
// fragment layouts and the rounding points are described there). bf16 storage only; the bf16
// default since a GPU session checked it against the emulation and timed it (H200, 2026-11-26:
// ViT-S/16 b256 1.19x the WMMA kernels' step); VIT_FLASH_MMA=0 picks WMMA (flash_attention.cu
// dispatches).
#include <cmath>

#include "ops/cuda/flash_common.cuh"
#include "ops/cuda/flash_mma.cuh"
#include "ops/cuda/flash_mma_kernels.cuh"

namespace vit::cuda {

using namespace flash_mma_kernels;

bool flash_mma_enabled() {  // the default since 2026-11-26; VIT_FLASH_MMA=0 picks WMMA
  return env_switch_on("VIT_FLASH_MMA");
}

// cp.async tile loads unless VIT_FLASH_ASYNC=0.
bool flash_mma_async() {
  return env_switch_on("VIT_FLASH_ASYNC");
}

void flash_mma_forward(bf16* out, float* lse, const bf16* qkv, Index B, Index N, Index H, Index D,
                       int tiles, bool vec) {
  const float scale_log2 = kLog2e / std::sqrt(float(D));
  const bool async = flash_mma_async();
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    launch_flash<flash_mma_forward_kernel<kD>>(unsigned(B * H * tiles), forward_smem_bytes<kD>(),
                                               out, lse, qkv, int(N), int(H), tiles, scale_log2,
                                               vec, async);
  });
}

// VIT_FLASH_STORED_DS=1: the dK/dV kernel stores dS^T (bf16, B * H * N * 64 ceil(N / 64)
// elements of scratch: 119 MB at ViT-S/16 b256) and dQ is formed from it, without the dQ
// kernel's recomputation of S, P and dP (2 of its 3 products and its exponentials). Opt-in until
// a GPU run measures it (FlashKernelsOnHost checks it gives the recomputing kernel's bits).
bool flash_mma_stored_ds() {
  return env_opt_in("VIT_FLASH_STORED_DS");
}

void flash_mma_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                        const float* drow, Index B, Index N, Index H, Index D, int tiles,
                        bool vec) {
  const float scale = 1.0f / std::sqrt(float(D));
  const bool async = flash_mma_async();
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    const unsigned grid = unsigned(B * H * tiles);
    if (flash_mma_stored_ds()) {
      const int ldq = tiles * kCols;
      const DsTiles ds{
          static_cast<bf16*>(scratch(size_t(B * H * N) * ldq * sizeof(bf16), kScratchFlashDs)),
          ldq};
      launch_flash<flash_mma_dkv_kernel<kD, true>>(grid, dkv_smem_bytes<kD>(), dqkv, dout, qkv, lse,
                                                   drow, int(N), int(H), tiles, scale, vec, async,
                                                   ds);
      launch_flash<flash_mma_dq_stored_kernel<kD>>(grid, dq_stored_smem_bytes<kD>(), dqkv, qkv, ds,
                                                   int(N), int(H), tiles, vec, async);
      return;
    }
    launch_flash<flash_mma_dkv_kernel<kD>>(grid, dkv_smem_bytes<kD>(), dqkv, dout, qkv, lse, drow,
                                           int(N), int(H), tiles, scale, vec, async, DsTiles{});
    launch_flash<flash_mma_dq_kernel<kD>>(grid, dq_smem_bytes<kD>(), dqkv, dout, qkv, lse, drow,
                                          int(N), int(H), tiles, scale, vec, async);
  });
}

}  // namespace vit::cuda
