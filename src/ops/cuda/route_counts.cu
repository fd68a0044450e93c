// kernel_route_counts() (ops.h): the routes' counters in one list, for the bench's report of which
// kernels each variant ran.
#include "ops/cuda/ops.h"

namespace vit::cuda {

KernelCalls kernel_route_counts() {
  return {
      {"gemm_simt_fallback", gemm_fallback_count()},
      {"epilogue_miss", gelu_epilogue_miss_count()},
  };
}

}  // namespace vit::cuda
