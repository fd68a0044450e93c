// The operation graphs cudnn_attention.cu plans: cuDNN's SDPA forward and backward operations,
// and the backward as cudnn-frontend composes it from matmuls, pointwise ops, a reduction and
// reshapes (the "composite" graph), whose dQ product written straight to dQ is the form cuDNN
// runs with a dP workspace: cudnn-frontend's deterministic backward on Hopper. Building and
// finalizing these needs the library but no device (a plan needs a device's handle).
#pragma once

#include "cudnn_backend.h"

#if VIT_CUDNN_HEADERS

namespace vit::cuda::cudnn {

// The tensors' unique ids in the graphs and variant packs; the composite graph's intermediates
// (virtual, in no variant pack) count up from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kdO,
  kdQ,
  kdK,
  kdV,
  kOne,         // composite backward: 1.0f by value
  kSoftmaxSum,  // composite backward: rowsum(dO * O) (B, H, N, 1) fp32, memory we give it
  kFirstVirtual = 100
};

// The SDPA forward: Q, K, V strided views of qkv (B, N, 3C) as (B, H, N, D), O of out (B, N, C),
// the statistics (B, H, N) fp32 (our lse) and the scale by value.
Operations forward_operation(int64_t B, int64_t N, int64_t H, int64_t D);

// The SDPA backward operation over the same views and dO, dQ, dK, dV; kv_transposed: K and V
// described as K^T and V^T (B, H, D, N).
Operations backward_operation(int64_t B, int64_t N, int64_t H, int64_t D, bool kv_transposed);

// The composite backward: the same tensors (K and V as K^T and V^T), plus kOne and kSoftmaxSum.
Operations composite_backward(int64_t B, int64_t N, int64_t H, int64_t D);

}  // namespace vit::cuda::cudnn

#endif  // VIT_CUDNN_HEADERS
