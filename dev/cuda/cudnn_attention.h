// cuDNN's fused attention for bf16 (cudnn_attention.cu), an experiment outside vitrain
// (README.md): the flash ops' arguments and results.
#pragma once
#include <string>

#include "ops/cuda/ops.h"

namespace vit::cuda {

// cuDNN's fused attention in place of those kernels for bf16, opt-in (cudnn_attention.cu):
// VIT_CUDNN_ATTENTION=1 both directions, fwd or bwd one. The same arguments and results as the
// flash ops (lse: the same natural-log statistics); true if cuDNN ran it, false (nothing done,
// one line on stderr the first time) where it is not asked for, not loadable, too old, or
// declines the shape or the buffers' alignment. Not bitwise reproducible by contract.
bool cudnn_attention_forward(bf16* out, float* lse, const bf16* qkv, Index B, Index N, Index H,
                             Index D);
bool cudnn_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, Index B, Index N, Index H, Index D);
// How many times cuDNN ran each direction in this process (tests and the bench's check), how
// many backward runs took the composite graph (VIT_CUDNN_BWD), and how many runs were on an
// engine cuDNN notes as nondeterministic (only with VIT_CUDNN_NONDETERMINISTIC=1).
struct CudnnAttentionCounts {
  long forward = 0, backward = 0, composite = 0, nondeterministic = 0;
};
CudnnAttentionCounts cudnn_attention_counts();
// "cuDNN <version>" as loaded, or why it was not.
std::string cudnn_attention_library();
// The graphs cudnn_attention.cu plans: the SDPA forward, the SDPA backward operation, and the
// backward composed of matmuls and pointwise ops (cudnn_attention_graphs.h).
enum class CudnnAttentionGraph { kForward, kBackwardOperation, kBackwardComposite };
// Builds and finalizes a graph's operations and tensors for a shape, which needs the library but
// no device: "" if cuDNN accepts them, else its message (tests).
std::string cudnn_attention_check_graph(CudnnAttentionGraph graph, Index B, Index N, Index H,
                                        Index D);

}  // namespace vit::cuda
