#include "ops/cpu/ema.h"

namespace vit::cpu {

template <typename T>
void ema_update(T* ema, const T* params, Index n, double decay) {
  // ema, params (n)
  const T w = T(1.0 - decay);  // PyTorch rounds the Python-float weight to the tensor's type
#pragma omp parallel for simd schedule(static)
  for (Index i = 0; i < n; ++i) ema[i] = lerp_fused(ema[i], params[i], w);
}

template void ema_update<float>(float*, const float*, Index, double);
template void ema_update<double>(double*, const double*, Index, double);

}  // namespace vit::cpu
