#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace vit {

double LrSchedule::at(double t) const {
  if (t < warmup) return warmup_lr + t * (base_lr - warmup_lr) / warmup;
  if (t >= total) return min_lr;
  return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * t / total));
}

double ema_decay(int64_t step, double decay, bool warmup) {
  const int64_t t = std::max<int64_t>(0, step - 1);
  if (t <= 0) return 0.0;
  if (!warmup) return decay;
  return std::max(std::min(1.0 - std::pow(1.0 + double(t), -2.0 / 3.0), decay), 0.0);
}

double ema_first_share(int64_t steps, double decay, bool warmup) {
  if (steps <= 1) return 1.0;
  if (!warmup) return std::pow(decay, double(steps - 1));
  double share = 1.0;
  for (int64_t step = 2; step <= steps && share > 1e-12; ++step)
    share *= ema_decay(step, decay, warmup);
  return share;
}

}  // namespace vit
