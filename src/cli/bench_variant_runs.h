// `vitrain bench --variant`'s runs: each variant's kernel-plan preset timed in interleaved rounds
// in one process, and one line a variant (bench_variants.h parses the specs).
#pragma once
#include <functional>
#include <memory>
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

// An engine with these kernel options (the bench's model, batch and device otherwise).
using BenchEngineMaker = std::function<std::unique_ptr<Engine>(const KernelOptions&)>;
// One training step on `engine`.
using BenchStep = std::function<void(Engine&)>;

// Each variant in turn, `rounds` times in rotated orders; a run builds the variant's engine
// (its own kernel plan, its graphs captured anew), times `steps` steps after `warmup` untimed
// ones, and frees it. One line a variant: its runs' img/s, their median, that median over the
// first variant's, its options and resolved plan (on the GPU also the MFU and graph replays).
// A variant whose run throws is left out of the later rounds and its line says why; the others
// go on, so one kernel's failure does not take the whole comparison with it. Returns the exit
// code: 1 if any variant failed.
int run_bench_variants(const BenchEngineMaker& make_engine, const BenchStep& step,
                       const std::vector<BenchVariant>& variants, const VariantBenchShape& shape);

}  // namespace vit
