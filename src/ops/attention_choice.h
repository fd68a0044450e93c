// Which attention the mixed-precision backends run (the CUDA backend, and the CPU bf16
// emulation, which must round where the GPU rounds and so makes the same choice), as the kernel
// plan decides (ops/kernel_plan.h, the attention family; --kernels attention=...):
//  * fused (flash-style, src/ops/cuda/flash_attention*.cu; emulated in src/ops/emu): no
//    (B, H, N, N) tensor; saves the row log-sum-exp (B, H, N) fp32 for the backward, which
//    recomputes the probabilities. Used for the head dims the fused kernels are built for.
//  * unfused (attention.cu): saves the probabilities (B, H, N, N) in the storage type.
// The fp32/fp64 CPU reference always runs unfused.
#pragma once
#include "core/common.h"
#include "ops/kernel_plan.h"

namespace vit {

// Rows of the key (forward) and query (backward) tiles the fused kernels stream: the online
// softmax rescales at these boundaries, so the emulation walks the same tiles.
constexpr Index kFlashTile = 64;

}  // namespace vit
