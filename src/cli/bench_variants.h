// `vitrain bench --variant NAME:ASSIGNMENTS`: kernel switches (environment variables read at
// each op call, such as VIT_CUDNN_ATTENTION or VIT_SM90_GEMM) timed against each other in one
// process, in interleaved rounds, so that the comparison shares one GPU's warm state and pays the
// process's start once. A GPU session's minutes are scarce: a separate process a variant spent
// most of them starting up.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/kernel_calls.h"

namespace vit {

struct BenchVariant {
  std::string name;
  std::vector<std::pair<std::string, std::string>> env;  // (variable, value), in order
};

// "NAME:VAR=VALUE VAR=VALUE ..." (assignments separated by spaces; none: the process's own
// environment). Throws vit::Error with one clear line on a malformed spec: no name, no ':', an
// assignment without '=' or with an empty variable name, or a variable named twice.
BenchVariant parse_bench_variant(const std::string& spec);

// The variants' names must differ (one clear error line otherwise).
void check_bench_variants(const std::vector<BenchVariant>& variants);

// The order of round r (0-based) over n variants: rotated by r, so each variant is first in
// turn and none always runs on a warmer (or cooler) device.
std::vector<int> bench_round_order(int n, int round);

// Which opt-in kernels a variant ran, from Engine::kernel_calls readings (core/kernel_calls.h).
// The calls made between two readings, in `after`'s order (a route missing from `before`
// counts from 0).
KernelCalls route_calls_since(const KernelCalls& before, const KernelCalls& after);
// total += more, route by route (a route new to total is appended).
void add_route_calls(KernelCalls& total, const KernelCalls& more);
// {"route":calls,...} with every route, for the JSON line.
nlohmann::ordered_json route_calls_json(const KernelCalls& calls);
// "route calls, ..." for the routes that ran; "" if none did.
std::string route_calls_text(const KernelCalls& calls);

// Sets a variant's variables for its lifetime and restores each one's previous value (or its
// absence) after.
class ScopedVariantEnv {
 public:
  explicit ScopedVariantEnv(const BenchVariant& variant);
  ~ScopedVariantEnv();
  ScopedVariantEnv(const ScopedVariantEnv&) = delete;
  ScopedVariantEnv& operator=(const ScopedVariantEnv&) = delete;

 private:
  struct Saved {
    std::string name, value;
    bool was_set;
  };
  std::vector<Saved> saved_;
};

}  // namespace vit
