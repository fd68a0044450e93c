// `vitrain bench --variant`'s runs: each variant's kernel switches timed in interleaved rounds
// in one process, and one line a variant (bench_variants.h parses the specs).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "cli/bench_variants.h"
#include "train/engine.h"

namespace vit {

// What every variant's run shares: the steps, the model's name and a training image's FLOPs
// (for the MFU against 989 TFLOP/s), and the output's form.
struct VariantBenchShape {
  int rounds = 3, warmup = 2, steps = 10, batch = 1;
  std::string model_name;
  double flops_per_image = 0;
  bool json = false;
};

// Each variant's switches applied in turn, `rounds` times in rotated orders, each run timing
// `steps` calls of `step` after `warmup` untimed ones (its CUDA graphs captured anew); one line a
// variant: its runs' img/s, their median, and that median over the first variant's (on the GPU
// also the median's MFU, its opt-in kernels' calls and graph replays). A variant whose run throws
// is left out of the later rounds and its line says why; the others go on (as far as the device
// still can), so one new kernel's failure does not take the whole comparison with it. Returns
// the exit code: 1 if any variant failed.
int run_bench_variants(Engine& engine, const std::function<void()>& step,
                       const std::vector<BenchVariant>& variants, const VariantBenchShape& shape);

}  // namespace vit
