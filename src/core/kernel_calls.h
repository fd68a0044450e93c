// How many op calls took each of the opt-in kernel routes (the sm_90a GEMM, cuDNN's attention,
// the one-kernel flash backward, ...: ops/cuda/ops.h kernel_route_counts), as (route, calls) in a
// fixed order; empty on the host backends. Counted on the host: a replayed CUDA graph repeats its
// calls uncounted, so a count says whether a route ran, not how often the device ran it. One type
// from the ops through the backends and Engine::kernel_calls to the bench's report.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vit {

using KernelCalls = std::vector<std::pair<std::string, int64_t>>;

}  // namespace vit
