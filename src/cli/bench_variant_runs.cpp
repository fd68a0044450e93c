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

// One variant's runs over the rounds: img/s a run, its resolved plan, the graph replays among
// its timed passes, and the error that ended its runs, if one did.
struct VariantRuns {
  std::vector<double> rates;
  nlohmann::ordered_json plan;
  bool on_gpu = false;
  std::string device;
  int64_t replays = 0, timed_passes = 0;
  std::string error;
};

// One run of a variant on an engine of its own: `warmup` untimed steps, then `steps` timed.
// Throws what a step throws. VIT_TEST_BENCH_VARIANT_FAILS=NAME: that variant fails (tests).
void run_variant_once(const BenchEngineMaker& make_engine, const BenchStep& step,
                      const BenchVariant& variant, const VariantBenchShape& shape,
                      VariantRuns& runs) {
  const char* failing = std::getenv("VIT_TEST_BENCH_VARIANT_FAILS");
  VIT_CHECK(!failing || variant.name != failing,
            "VIT_TEST_BENCH_VARIANT_FAILS names it (a test's failing variant)");
  std::unique_ptr<Engine> engine = make_engine(variant.options);
  const BenchRun run = warm_up_and_time(
      *engine, [&] { step(*engine); }, shape.warmup, shape.steps, shape.batch);
  runs.rates.push_back(run.timed.img_per_s);
  runs.replays += run.graph_replays;
  runs.timed_passes += shape.steps;
  runs.plan = engine->kernel_plan();  // after the run: tuned picks included
  runs.on_gpu = engine->on_gpu();
  runs.device = engine->description();
}

// A variant's line: JSON (the rates, their median and its ratio to the first variant's, the
// plan, and on the GPU the MFU and graph replays; "error" where its runs ended in one) or text.
void print_variant(const BenchVariant& variant, const VariantRuns& runs, double first_median,
                   const std::string& first_name, const VariantBenchShape& shape) {
  const bool ran = !runs.rates.empty();
  const double median = ran ? median_of(runs.rates) : 0.0;
  const bool ratio = ran && first_median > 0;
  if (shape.json) {
    nlohmann::ordered_json j;
    j["impl"] = "vitrain";
    j["device"] = runs.device;
    j["model"] = shape.model_name;
    j["batch"] = shape.batch;
    j["variant"] = variant.name;
    j["img_per_s_rounds"] = nlohmann::ordered_json::array();
    for (double r : runs.rates) j["img_per_s_rounds"].push_back(std::round(r * 100) / 100);
    if (ran) j["median_img_per_s"] = std::round(median * 100) / 100;
    if (ratio) j["ratio_to_first"] = std::round(median / first_median * 1e4) / 1e4;
    if (runs.on_gpu) {
      if (ran) j["mfu"] = std::round(shape.flops_per_image * median / 989e12 * 1e4) / 1e4;
      j["graph_replays"] = runs.replays;
      j["timed_passes"] = runs.timed_passes;
    }
    j["kernels"] = runs.plan.is_null()
                       ? nlohmann::ordered_json{{"options", to_string(variant.options)}}
                       : runs.plan;
    if (!runs.error.empty()) j["error"] = runs.error;
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("{} batch {} variant {} ({}): ", shape.model_name, shape.batch, variant.name,
             variant.kernels.empty() ? "default kernels" : variant.kernels);
  if (ran)
    fmt::print("median {:.1f} img/s over {} rounds [{}]", median, runs.rates.size(),
               rate_list(runs.rates));
  if (ratio) fmt::print(", {:.3f}x {}", median / first_median, first_name);
  if (!runs.error.empty()) fmt::print("{}FAILED: {}", ran ? "; " : "", runs.error);
  fmt::print("\n");
}

}  // namespace

int run_bench_variants(const BenchEngineMaker& make_engine, const BenchStep& step,
                       const std::vector<BenchVariant>& variants, const VariantBenchShape& shape) {
  std::vector<VariantRuns> runs(variants.size());
  for (int r = 0; r < shape.rounds; ++r)
    for (const int i : bench_round_order(int(variants.size()), r)) {
      VariantRuns& v = runs[size_t(i)];
      if (!v.error.empty()) continue;
      try {
        run_variant_once(make_engine, step, variants[size_t(i)], shape, v);
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
    print_variant(variants[i], runs[i], first, variants[0].name, shape);
    failed = failed || !runs[i].error.empty();
  }
  return failed ? 1 : 0;
}

}  // namespace vit
