// kernel_route_counts() (ops.h): the routes' counters in one list, for the bench's report of which
// kernels each variant ran.
#include <array>
#include <atomic>

#include "ops/cuda/ops.h"
#include "ops/cuda/route_counts.h"

namespace vit::cuda {

namespace {

std::array<std::atomic<Index>, size_t(Route::kCount)> g_routes{};

Index route_calls(Route route) {
  return g_routes[size_t(route)].load(std::memory_order_relaxed);
}

}  // namespace

void count_route(Route route) {
  g_routes[size_t(route)].fetch_add(1, std::memory_order_relaxed);
}

KernelCalls kernel_route_counts() {
  const CudnnAttentionCounts cudnn = cudnn_attention_counts();
  return {
      {"sm90_gemm", sm90_gemm_count()},
      {"gemm_simt_fallback", gemm_fallback_count()},
      {"epilogue_miss", gelu_epilogue_miss_count()},
      {"bias_grad_epilogue", route_calls(Route::kBiasGradEpilogue)},
      {"flash_fused_backward", route_calls(Route::kFlashFusedBackward)},
      {"cudnn_forward", cudnn.forward},
      {"cudnn_backward", cudnn.backward},
      {"cudnn_backward_composite", cudnn.composite},
      {"cudnn_nondeterministic", cudnn.nondeterministic},
  };
}

}  // namespace vit::cuda
