// `vitrain bench --variant`'s runs (bench_variant_runs.h).
#include "cli/bench_variant_runs.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>

#include "cli/bench_timing.h"
#include "core/common.h"

namespace vit {

namespace {

// "; opt-in kernels: route calls, ..." where any ran (each counted op call is an eager pass's or
// a graph capture's: the bench's replays do not count).
std::string routes_suffix(const KernelCalls& calls) {
  const std::string text = route_calls_text(calls);
  return text.empty() ? "" : "; opt-in kernels: " + text;
}

// One variant's runs over the rounds: img/s a run, its opt-in kernels' calls, the graph replays
// among its timed passes, and the error that ended its runs, if one did.
struct VariantRuns {
  std::vector<double> rates;
  KernelCalls routes;
  int64_t replays = 0, timed_passes = 0;
  std::string error;
};

// One run of a variant: its switches set, the graphs dropped and turned on again (another
// variant's kernels may have broken a capture), `warmup` untimed steps, then `steps` timed.
// Throws what a step throws. VIT_TEST_BENCH_VARIANT_FAILS set: a variant that fails (tests).
void run_variant_once(Engine& engine, const std::function<void()>& step,
                      const BenchVariant& variant, int warmup, int steps, int batch,
                      VariantRuns& runs) {
  const ScopedVariantEnv env(variant);
  VIT_CHECK(!std::getenv("VIT_TEST_BENCH_VARIANT_FAILS"),
            "VIT_TEST_BENCH_VARIANT_FAILS is set (a test's failing variant)");
  engine.drop_graphs();
  const BenchRun run = warm_up_and_time(engine, step, warmup, steps, batch);
  runs.rates.push_back(run.timed.img_per_s);
  runs.replays += run.graph_replays;
  runs.timed_passes += steps;
  add_route_calls(runs.routes, run.routes);
}

// A variant's line: JSON (the rates, their median and its ratio to the first variant's, and on
// the GPU the MFU, opt-in kernel calls and graph replays; "error" where its runs ended in one)
// or text.
void print_variant(const Engine& engine, const BenchVariant& variant, const VariantRuns& runs,
                   double first_median, const std::string& first_name,
                   const VariantBenchShape& shape) {
  const std::string& model_name = shape.model_name;
  const int batch = shape.batch;
  const bool ran = !runs.rates.empty();
  const double median = ran ? median_of(runs.rates) : 0.0;
  const bool ratio = ran && first_median > 0;
  if (shape.json) {
    nlohmann::ordered_json j;
    j["impl"] = "vitrain";
    j["device"] = engine.description();
    j["model"] = model_name;
    j["batch"] = batch;
    j["variant"] = variant.name;
    j["env"] = nlohmann::ordered_json::object();
    for (const auto& [name, value] : variant.env) j["env"][name] = value;
    j["img_per_s_rounds"] = nlohmann::ordered_json::array();
    for (double r : runs.rates) j["img_per_s_rounds"].push_back(std::round(r * 100) / 100);
    if (ran) j["median_img_per_s"] = std::round(median * 100) / 100;
    if (ratio) j["ratio_to_first"] = std::round(median / first_median * 1e4) / 1e4;
    if (engine.on_gpu()) {
      if (ran) j["mfu"] = std::round(shape.flops_per_image * median / 989e12 * 1e4) / 1e4;
      j["kernel_calls"] = route_calls_json(runs.routes);
      j["graph_replays"] = runs.replays;
      j["timed_passes"] = runs.timed_passes;
    }
    if (!runs.error.empty()) j["error"] = runs.error;
    fmt::print("{}\n", j.dump());
    return;
  }
  std::string env;  // "VAR=VALUE ..."
  for (const auto& [name, value] : variant.env)
    env += fmt::format("{}{}={}", env.empty() ? "" : " ", name, value);
  fmt::print("{} batch {} variant {} ({}): ", model_name, batch, variant.name,
             env.empty() ? "no switches" : env);
  if (ran)
    fmt::print("median {:.1f} img/s over {} rounds [{}]", median, runs.rates.size(),
               rate_list(runs.rates));
  if (ratio) fmt::print(", {:.3f}x {}", median / first_median, first_name);
  if (!runs.error.empty()) fmt::print("{}FAILED: {}", ran ? "; " : "", runs.error);
  fmt::print("{}\n", routes_suffix(runs.routes));
}

}  // namespace

int run_bench_variants(Engine& engine, const std::function<void()>& step,
                       const std::vector<BenchVariant>& variants, const VariantBenchShape& shape) {
  std::vector<VariantRuns> runs(variants.size());
  for (int r = 0; r < shape.rounds; ++r)
    for (const int i : bench_round_order(int(variants.size()), r)) {
      VariantRuns& v = runs[size_t(i)];
      if (!v.error.empty()) continue;
      try {
        run_variant_once(engine, step, variants[size_t(i)], shape.warmup, shape.steps, shape.batch,
                         v);
        // as it goes: a crash (not an exception) would take the lines at the end with it
        fmt::print(stderr, "bench: round {} variant {}: {:.1f} img/s\n", r + 1,
                   variants[size_t(i)].name, v.rates.back());
      } catch (const std::exception& e) {
        v.error = e.what();
        fmt::print(stderr, "error: bench: variant {} failed: {}\n", variants[size_t(i)].name,
                   v.error);
      }
    }
  const double first = runs[0].rates.empty() ? 0.0 : median_of(runs[0].rates);
  bool failed = false;
  for (size_t i = 0; i < variants.size(); ++i) {
    print_variant(engine, variants[i], runs[i], first, variants[0].name, shape);
    failed = failed || !runs[i].error.empty();
  }
  return failed ? 1 : 0;
}

}  // namespace vit
