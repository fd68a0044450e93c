// The ops' side of autotuning (ops/autotune.h): the choice for an op key from the active kernel
// plan, timing each bit-identical candidate on the op's own arguments first when the plan tunes
// and the key is new. Only ops whose outputs a repeat overwrites (never accumulates) may time
// this way; the others pass no launcher and keep the rule's pick.
#pragma once
#include <cuda_runtime.h>

#include <functional>

#include "ops/cuda/common.cuh"
#include "ops/kernel_plan.h"

namespace vit::cuda {

// Milliseconds a call of launch(choice) takes on the op stream: a warm-up call, then the mean
// of a few, timed with events. Waits for the device (plan time only, never in a graph).
double time_launches_ms(const std::function<void(const KernelChoice&)>& launch,
                        const KernelChoice& choice);

// planned_choice(key), with launch(candidate) timed per candidate where the plan tunes this key
// (and the op stream is not capturing a graph, where nothing may wait).
KernelChoice tuned_choice(const OpKey& key, const std::function<void(const KernelChoice&)>& launch);

}  // namespace vit::cuda
