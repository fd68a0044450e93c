// Timing `vitrain bench`'s training steps: one run's whole rate and its chunks' rates.
#pragma once
#include <cstdint>
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

// One run's results: its rates, and how many of the timed passes were graph replays.
struct BenchRun {
  TimedSteps timed;
  int64_t graph_replays = 0;
};

// `warmup` untimed calls of `step` (each a training step of `batch` images), waited for, then
// `steps` timed ones: the whole time gives img_per_s, marks on the device's timeline the chunks'
// rates. The op profile (if on) starts over after the warm-up, so its table is the timed steps'.
// Throws vit::Error if the loss is not finite.
BenchRun warm_up_and_time(Engine& engine, const std::function<void()>& step, int warmup, int steps,
                          int batch);

// Rates as "r1,r2,...", each to 0.01 img/s.
std::string rate_list(const std::vector<double>& rates);

}  // namespace vit
