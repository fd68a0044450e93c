#include "ops/cpu/pixel_steps.h"

namespace vit::cpu {

void apply_pixel_steps(uint8_t* images, const PixelStep* steps, int32_t slots, Index B, Index C,
                       Index S, const PixelFill& fill) {
#pragma omp parallel for schedule(dynamic)
  for (Index b = 0; b < B; ++b)
    for (int32_t k = 0; k < slots; ++k)
      apply_pixel_step(steps[b * slots + k], images + b * C * S * S, C, S, S, fill);
}

}  // namespace vit::cpu
