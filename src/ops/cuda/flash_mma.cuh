// The mma.sync fused attention (flash_attention_mma.cu), which flash_attention.cu's entry
// points dispatch to for bf16. Shapes are checked by the caller, and drow (B, H, N) =
// rowsum(dO * out) computed there.
#pragma once
#include <cuda_bf16.h>

#include "core/common.h"

namespace vit::cuda {

void flash_mma_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, Index B, Index N,
                       Index H, Index D, bool vec);
void flash_mma_backward(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                        const float* lse, const float* drow, Index B, Index N, Index H, Index D,
                        bool vec);

}  // namespace vit::cuda
