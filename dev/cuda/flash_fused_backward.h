// The one-kernel flash backward (flash_fused_backward.cu), an experiment outside vitrain
// (README.md).
#pragma once
#include <cuda_bf16.h>

#include "core/common.h"

namespace vit::cuda {

// Whether flash_fused_backward takes this N and head dim D on this device.
bool flash_mma_fused_backward_takes(Index N, Index D);
// dqkv (B, N, 3C) from dout (B, N, C), qkv (B, N, 3C), lse and drow (B, H, N) as vitrain's
// flash_mma_backward takes them; false (nothing enqueued) where it does not take the shape.
bool flash_fused_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                          const float* lse, const float* drow, Index B, Index N, Index H, Index D,
                          bool vec);

}  // namespace vit::cuda
