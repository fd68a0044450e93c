// EfficientTrain++'s low-frequency pass over a batch as two fp32 GEMMs (no TF32): the twin of
// src/ops/cpu/lowfreq_batch.cpp, equal to it to float rounding (the summation orders differ).
#include "ops/cuda/blas.cuh"
#include "ops/cuda/ops.h"

namespace vit::cuda {

void lowfreq_batch(const float* in, const float* op, bool complex, Index planes, Index F, Index S,
                   float* scratch, float* out) {
  // in (planes, F, F); op (2, S, F); scratch (planes * F, w); out (planes, S, S)
  if (planes <= 0) return;
  const Index w = complex ? 2 * S : S;
  gemm<float, float>(false, true, planes * F, w, F, 1.0f, in, F, 0, op, F, 0, 0.0f, scratch, w, 0);
  // Per plane, the operator broadcast (batch stride 0) against that plane's block of U.
  gemm<float, float>(false, false, S, S, F, 1.0f, op, F, 0, scratch, w, F * w, 0.0f, out, S, S * S,
                     planes);
  if (complex)
    gemm<float, float>(false, false, S, S, F, -1.0f, op + S * F, F, 0, scratch + S, w, F * w, 1.0f,
                       out, S, S * S, planes);
}

}  // namespace vit::cuda
