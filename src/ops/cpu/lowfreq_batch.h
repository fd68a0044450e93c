// EfficientTrain++'s low-frequency pass over a batch (core/lowfreq_operator.h) as matrix
// products: the CPU reference of src/ops/cuda/lowfreq_batch.cu, used where a planned batch is
// made at the final side F and trained at S (--augment-on-device with --efficienttrain).
#pragma once
#include <cstddef>

#include "core/common.h"

namespace vit::cpu {

// Floats of lowfreq_batch's scratch: (planes * F, 2S) with an imaginary part, else (planes * F, S).
inline size_t lowfreq_scratch_floats(Index planes, Index F, Index S, bool complex) {
  return size_t(planes * F * (complex ? 2 * S : S));
}

// out[p] (S, S) = Re M in[p] Re M^T - Im M in[p] Im M^T for every plane p of in (planes, F, F),
// M (S, F) from op (2, S, F) = lowfreq_operator(...); complex: false skips Im M (all zero for the
// down-sampling). Two passes: scratch U = in (planes * F, F) @ [Re M; Im M]^T as one product,
// then per plane Re M @ U[p] (:, :S) - Im M @ U[p] (:, S:). in and out must not overlap.
void lowfreq_batch(const float* in, const float* op, bool complex, Index planes, Index F, Index S,
                   float* scratch, float* out);

}  // namespace vit::cpu
