// Counters of the opt-in kernel routes that kernel_route_counts() (ops.h) reports beside the
// older ones (sm90_gemm_count, cudnn_attention_counts, gemm_fallback_count), for the ops that
// take a route on the host and may decline it (a shape, a device, a library).
#pragma once

namespace vit::cuda {

enum class Route {
  kFlashFusedBackward,    // VIT_FLASH_FUSED_BWD: the one-kernel backward launched
  kBiasGradEpilogue,      // VIT_BIAS_GRAD_EPILOGUE: a bias gradient in the GEMM's epilogue
  kCount
};

// One op call that took `route` (relaxed atomic: process-wide, any thread).
void count_route(Route route);

}  // namespace vit::cuda
