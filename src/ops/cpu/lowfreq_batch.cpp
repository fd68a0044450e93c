#include "ops/cpu/lowfreq_batch.h"

#include "ops/cpu/blas.h"

namespace vit::cpu {

void lowfreq_batch(const float* in, const float* op, bool complex, Index planes, Index F, Index S,
                   float* scratch, float* out) {
  if (planes <= 0) return;
  const Index w = complex ? 2 * S : S;  // U's row: x Re M^T (S) then x Im M^T (S)
  // U (planes * F, w) = in (planes * F, F) @ op[:w]^T: the right-hand products of every plane.
  gemm(false, true, planes * F, w, F, 1.0f, in, F, op, F, 0.0f, scratch, w);
  const float* re = op;
  const float* im = op + S * F;
  for (Index p = 0; p < planes; ++p) {
    const float* u = scratch + p * F * w;  // (F, w)
    float* y = out + p * S * S;            // (S, S)
    gemm(false, false, S, S, F, 1.0f, re, F, u, w, 0.0f, y, S);
    if (complex) gemm(false, false, S, S, F, -1.0f, im, F, u + S, w, 1.0f, y, S);
  }
}

}  // namespace vit::cpu
