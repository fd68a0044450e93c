// Which attention the mixed-precision backends run (the CUDA backend, and the CPU bf16
// emulation, which must round where the GPU rounds and so makes the same choice):
//  * fused (flash-style, src/ops/cuda/flash_attention.cu; emulated in src/ops/emu): no
//    (B, H, N, N) tensor; saves the row log-sum-exp (B, H, N) fp32 for the backward, which
//    recomputes the probabilities. Used for the head dims the fused kernels are built for.
//  * unfused (attention.cu): saves the probabilities (B, H, N, N) in the storage type.
// VIT_FLASH_ATTENTION=0 in the environment forces the unfused path (for comparisons); read on
// every call, so a test can switch it. The fp32/fp64 CPU reference always runs unfused.
#pragma once
#include <cstdlib>
#include <cstring>

#include "core/common.h"

namespace vit {

// Head dims the fused kernels are instantiated for (flash_attention.cu's with_head_dim).
inline bool flash_head_dim_supported(Index D) {
  return D == 32 || D == 48 || D == 64 || D == 96;
}

inline bool use_flash_attention(Index D) {
  const char* env = std::getenv("VIT_FLASH_ATTENTION");
  return flash_head_dim_supported(D) && !(env && std::strcmp(env, "0") == 0);
}

// Rows of the key (forward) and query (backward) tiles the fused kernels stream: the online
// softmax rescales at these boundaries, so the emulation walks the same tiles.
constexpr Index kFlashTile = 64;

}  // namespace vit
