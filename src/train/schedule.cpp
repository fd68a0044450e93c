#include "train/schedule.h"

#include <cmath>

namespace vit {

double LrSchedule::at(double t) const {
  if (t < warmup) return warmup_lr + t * (base_lr - warmup_lr) / warmup;
  if (t >= total) return min_lr;
  return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * t / total));
}

}  // namespace vit
