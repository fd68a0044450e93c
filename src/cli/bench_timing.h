// Timing `vitrain bench`'s training steps: one run's whole rate and its chunks' rates.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "train/engine.h"

namespace vit {

// One timed run's rates: the whole run's img/s and its chunks'.
struct TimedSteps {
  double sec = 0, img_per_s = 0, median_img_per_s = 0;
  std::vector<double> chunk_img_per_s;
};

// The median of v (the mean of the middle two where v's size is even).
double median_of(std::vector<double> v);

// Times `steps` calls of `step` (each a training step of `batch` images; the caller has waited
// for the untimed ones): the whole time gives img_per_s, marks on the device's timeline the
// chunks' rates. Throws vit::Error if the loss is not finite.
TimedSteps time_steps(Engine& engine, const std::function<void()>& step, int steps, int batch);

// Rates as "r1,r2,...", each to 0.01 img/s.
std::string rate_list(const std::vector<double>& rates);

}  // namespace vit
