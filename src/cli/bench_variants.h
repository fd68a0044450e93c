// `vitrain bench --variant NAME:KERNELS`: kernel-plan presets (each a --kernels string) timed
// against each other in one process, in interleaved rounds, so that the comparison shares one
// GPU's warm state and pays the process's start once. Each run builds its own engine with its
// preset's plan.
#pragma once
#include <string>
#include <vector>

#include "ops/kernel_options.h"

namespace vit {

struct BenchVariant {
  std::string name;
  std::string kernels;  // as given ("" = the defaults)
  KernelOptions options;
};

// "NAME:k=v,k=v" (a --kernels string after the colon; "NAME:" for the defaults). Throws
// vit::Error with one clear line on a malformed spec: no name, no ':', or a bad option.
BenchVariant parse_bench_variant(const std::string& spec);

// The variants' names must differ (one clear error line otherwise).
void check_bench_variants(const std::vector<BenchVariant>& variants);

// The order of round r (0-based) over n variants: rotated by r, so each variant is first in
// turn and none always runs on a warmer (or cooler) device.
std::vector<int> bench_round_order(int n, int round);

}  // namespace vit
