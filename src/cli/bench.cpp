// `vitrain bench`: training-step throughput (forward, backward, AdamW) on synthetic data.
#include "cli/bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_variants.h"
#include "core/omp_wait.h"
#include "core/profile.h"
#include "core/rng.h"
#include "ops/attention_choice.h"
#include "train/engine.h"

namespace vit {

namespace {

// One timed run's rates: the whole run's img/s and its chunks'.
struct TimedSteps {
  double sec = 0, img_per_s = 0, median_img_per_s = 0;
  std::vector<double> chunk_img_per_s;
};

// The median of v (the mean of the middle two where v's size is even).
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Times `steps` steps after the untimed ones (waited for here), waited for once at the end: the
// whole time gives the figure. Marks on the device's timeline split them into up to kChunks
// chunks, whose rates (median, spread) say whether a moment's slowdown (a clock change, another
// process) moved it, which one short total cannot. The chunks are not waited for: each wait
// drained the queue and made the next chunk's first step wait for its batch's host copy (the
// ViT-S/16 b256 figure fell from 8,590 to 8,050 img/s on an H200, 2026-11-27).
TimedSteps time_steps(Engine& engine, const std::function<void()>& step, int steps, int batch) {
  constexpr int kChunks = 5;
  const int chunks = std::min(steps, kChunks);
  std::vector<int> chunk_steps;
  const auto t0 = std::chrono::steady_clock::now();
  engine.mark_time();
  for (int c = 0; c < chunks; ++c) {
    chunk_steps.push_back(steps / chunks + (c < steps % chunks ? 1 : 0));
    for (int i = 0; i < chunk_steps.back(); ++i) step();
    engine.mark_time();
  }
  const TrainStats ts = engine.read_stats();  // waits for the timed steps
  TimedSteps t;
  t.sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  VIT_CHECK(std::isfinite(ts.loss_sum), "bench: the loss is not finite");
  const std::vector<double> marks = engine.take_marks();
  for (int c = 0; c < chunks; ++c)
    t.chunk_img_per_s.push_back(double(batch) * chunk_steps[size_t(c)] /
                                std::max(marks[size_t(c) + 1] - marks[size_t(c)], 1e-9));
  t.img_per_s = double(batch) * steps / t.sec;
  t.median_img_per_s = median_of(t.chunk_img_per_s);
  return t;
}

// Rates as "r1,r2,...", each to 0.01 img/s.
std::string rate_list(const std::vector<double>& rates) {
  std::string list;
  for (double r : rates) list += fmt::format("{}{:.2f}", list.empty() ? "" : ",", r);
  return list;
}

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
  const KernelCalls before = engine.kernel_calls();
  engine.drop_graphs();
  for (int w = 0; w < warmup; ++w) step();
  engine.read_stats();  // waits for the untimed steps
  const int64_t replays = engine.graph_stats().replays;
  runs.rates.push_back(time_steps(engine, step, steps, batch).img_per_s);
  runs.replays += engine.graph_stats().replays - replays;
  runs.timed_passes += steps;
  add_route_calls(runs.routes, route_calls_since(before, engine.kernel_calls()));
}

// A variant's line: JSON (the rates, their median and its ratio to the first variant's, and on
// the GPU the MFU, opt-in kernel calls and graph replays; "error" where its runs ended in one)
// or text.
void print_variant(const Engine& engine, const BenchVariant& variant, const VariantRuns& runs,
                   double first_median, const std::string& first_name,
                   const std::string& model_name, int batch, double flops_per_image, bool json) {
  const bool ran = !runs.rates.empty();
  const double median = ran ? median_of(runs.rates) : 0.0;
  const bool ratio = ran && first_median > 0;
  if (json) {
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
      if (ran) j["mfu"] = std::round(flops_per_image * median / 989e12 * 1e4) / 1e4;
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

// --variant: each variant's switches applied in turn, `rounds` times in rotated orders, each
// timing `steps` steps after `warmup` untimed ones (its CUDA graphs captured anew); one line a
// variant: its runs' img/s, their median, and that median over the first variant's (and on the
// GPU the median's MFU: flops_per_image a training image's, against 989 TFLOP/s). A variant
// whose run throws is left out of the later rounds and its line says why; the others go on
// (as far as the device still can), so one new kernel's failure does not take the whole
// comparison with it. Returns the exit code: 1 if any variant failed.
int run_variants(Engine& engine, const std::function<void()>& step,
                 const std::vector<BenchVariant>& variants, int rounds, int warmup, int steps,
                 int batch, const std::string& model_name, double flops_per_image, bool json) {
  std::vector<VariantRuns> runs(variants.size());
  for (int r = 0; r < rounds; ++r)
    for (const int i : bench_round_order(int(variants.size()), r)) {
      VariantRuns& v = runs[size_t(i)];
      if (!v.error.empty()) continue;
      try {
        run_variant_once(engine, step, variants[size_t(i)], warmup, steps, batch, v);
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
    print_variant(engine, variants[i], runs[i], first, variants[0].name, model_name, batch,
                  flops_per_image, json);
    failed = failed || !runs[i].error.empty();
  }
  return failed ? 1 : 0;
}

}  // namespace

int run_bench(int argc, char** argv) {
  CLI::App app{"Measure training throughput of a model preset on synthetic data"};
  std::string model_name = "vit_bench_cpu", device = "auto", precision = "bf16", stem, ffn, gp;
  int batch = 128, steps = 10, warmup = 2, img_size = 0, threads = 0, rounds = 3;
  bool json = false, profile = false, fp32_residual = false, cuda_graph = true;
  std::vector<std::string> variant_specs;
  app.add_option("--model", model_name, "model preset");
  app.add_option("-b,--batch-size", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--img-size", img_size, "image size (0 = the preset's)");
  app.add_option("--stem", stem, "patch embedding: patch or conv (default: the preset's)")
      ->check(CLI::IsMember({"patch", "conv"}));
  app.add_option("--ffn", ffn,
                 "FFN: mlp, mlp_tanh (GELU's tanh form) or local (default: the preset's)")
      ->check(CLI::IsMember({"mlp", "mlp_tanh", "local"}));
  app.add_option("--gp", gp, "classifier: token or avg (default: the preset's)")
      ->check(CLI::IsMember({"token", "avg"}));
  app.add_option("--steps", steps, "timed training steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "OpenMP threads (0 = all cores)");
  app.add_option("--device", device, "cpu, cuda, auto or emu (CPU bf16 emulation)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto", "emu"}));
  app.add_option("--precision", precision, "cuda: bf16 or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_flag("--fp32-residual", fp32_residual,
               "bf16 modes: the residual stream and its gradient in fp32");
  app.add_flag("--cuda-graph,!--no-cuda-graph", cuda_graph,
               "cuda: replay each step's forward and backward as a CUDA graph, as train does "
               "(on by default, off under --profile; --cuda-graph=false: launch each op); the "
               "warm-up is then at least 4 steps, so both input slots' graphs are captured "
               "before the timing");
  app.add_flag("--json", json, "print one JSON line instead of text");
  app.add_option("--variant", variant_specs,
                 "NAME:VAR=VALUE ... (repeatable; NAME: for the environment as it is): time "
                 "these kernel switches against each other in this process, interleaved over "
                 "--rounds rounds, each run after its own warm-up (graphs captured anew); one "
                 "line a variant with its median over the first's. Only switches an op reads at "
                 "each call vary (not VIT_GEMM_AUTOTUNE, VIT_GEMM_FALLBACK, VIT_PROFILE, "
                 "VIT_FLASH_ATTENTION)");
  app.add_option("--rounds", rounds, "with --variant: rounds over the variants")
      ->check(CLI::PositiveNumber);
  app.add_flag("--profile", profile,
               "per-op table of the timed steps on stderr: ms per step, share, achieved "
               "TFLOP/s or GB/s (device times on the GPU; also VIT_PROFILE=1)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("bench: {}", e.what()));
  }
  if (threads > 0) omp_set_num_threads(threads);
  const bool profiled = profile || Profile::enabled();
  VIT_CHECK(!(cuda_graph && profiled && app.count("--cuda-graph") > 0),
            "bench: --cuda-graph and the op profile (--profile, VIT_PROFILE=1) do not go "
            "together: the profile times each op, a graph replays them all at once");
  if (profile) Profile::set_enabled(true);  // before the engine: it picks the timer
  std::vector<BenchVariant> variants;
  for (const std::string& spec : variant_specs) variants.push_back(parse_bench_variant(spec));
  check_bench_variants(variants);
  VIT_CHECK(variants.empty() || !profiled,
            "bench: --variant and the op profile (--profile, VIT_PROFILE=1) do not go together: "
            "the profile's table is one run's");

  ModelConfig cfg = model_preset(model_name);
  if (img_size > 0) cfg.img_size = img_size;
  if (!stem.empty()) cfg.stem = stem_from_string(stem);
  if (!ffn.empty()) cfg.ffn = ffn_from_string(ffn);
  if (!gp.empty()) cfg.classifier = classifier_from_string(gp);
  cfg.validate();
  EngineOptions eo;
  eo.device = resolve_device(device);
  // Graphs are the CUDA backend's (train's default there); the profile times op by op.
  cuda_graph = cuda_graph && eo.device == "cuda" && !profiled;
  // Each of the two input slots' passes runs eagerly once, then is captured (pass_graphs.h).
  if (cuda_graph) warmup = std::max(warmup, 4);
  eo.precision = precision;
  eo.fp32_residual = fp32_residual;
  eo.cuda_graph = cuda_graph;
  eo.cfg = cfg;
  eo.max_batch = batch;
  std::unique_ptr<Engine> engine = make_engine(eo);
  const Index K = cfg.num_classes;
  std::vector<float> images(Index(batch) * cfg.in_chans * cfg.img_size * cfg.img_size);
  std::vector<float> targets(Index(batch) * K, 0.0f);
  Rng rng(1);
  for (auto& x : images) x = float(rng.normal());
  for (int b = 0; b < batch; ++b) targets[b * K + rng.below(K)] = 1.0f;

  auto step = [&] {
    engine->zero_grad();
    engine->forward_backward(images.data(), targets.data(), batch, 1.0f / float(batch), 0);
    // AdamW reads params, grads, m, v and writes params, m, v: 7 fp32 per parameter.
    ProfileScope prof("adamw", {0.0, 28.0 * double(engine->table().total)});
    engine->step(1e-4);
  };
  if (!variants.empty()) {
    return run_variants(*engine, step, variants, rounds, warmup, steps, batch, model_name,
                        3.0 * cfg.forward_flops_per_image(), json);
  }
  const KernelCalls routes_before = engine->kernel_calls();
  for (int i = 0; i < warmup; ++i) step();
  engine->read_stats();  // waits for the warm-up steps on the device
  const int64_t warmup_replays = engine->graph_stats().replays;
  Profile::reset();
  const TimedSteps timed = time_steps(*engine, step, steps, batch);
  const double sec = timed.sec, img_per_s = timed.img_per_s;
  const double median_img_per_s = timed.median_img_per_s;
  if (Profile::enabled()) Profile::print(stderr, steps);
  const std::string chunk_list = rate_list(timed.chunk_img_per_s);
  const double gflops = 3.0 * cfg.forward_flops_per_image() * img_per_s / 1e9;
  const bool gpu = engine->on_gpu();
  // MFU against the dense bf16 peak of an H100/H200 SXM (989 TFLOP/s), the yardstick.
  const double mfu = gflops * 1e9 / 989e12;
  const double mem_gib = engine->device_memory_bytes() / double(1 << 30);
  const bool conv_stem = cfg.stem == Stem::Conv;
  // The architecture's choices beyond the preset's name, for the text line.
  std::string arch = conv_stem ? "conv stem" : "";
  if (cfg.ffn == Ffn::Local) arch += arch.empty() ? "locality FFN" : ", locality FFN";
  if (cfg.ffn == Ffn::MlpTanh) arch += arch.empty() ? "tanh GELU" : ", tanh GELU";
  // The CPU reference always runs unfused; the GPU and its emulation fuse where they can.
  const bool fused = eo.device != "cpu" && use_flash_attention(cfg.head_dim());
  // Graphs asked for: how many timed passes were replays (all of them, or 0 where they did not
  // run: see stderr).
  const std::string graph_json =
      cuda_graph
          ? fmt::format(",\"graph_replays\":{}", engine->graph_stats().replays - warmup_replays)
          : std::string();
  const KernelCalls routes = route_calls_since(routes_before, engine->kernel_calls());
  const std::string spin = openmp_spin_setting();    // what libgomp runs with
  const StateMemory state = engine->state_memory();  // weights, gradients, AdamW moments
  constexpr double kMiB = 1024.0 * 1024.0;
  if (json) {
    fmt::print(
        "{{\"impl\":\"vitrain-{}\",\"device\":\"{}\",\"model\":\"{}\",\"batch\":{},"
        "\"threads\":{},\"attention\":\"{}\",\"img_per_s\":{:.2f},\"ms_per_step\":{:.2f},"
        "\"gflops\":{:.2f},\"state_mib\":{:.2f},\"optimizer_mib\":{:.2f},\"ffn\":\"{}\","
        "\"gp\":\"{}\",\"omp_spin\":{},\"median_img_per_s\":{:.2f},\"chunk_img_per_s\":[{}]{}{}"
        "{}{}}}\n",
        eo.device, engine->description(), model_name, batch, omp_get_max_threads(),
        fused ? "fused" : "unfused", img_per_s, 1e3 * sec / steps, gflops, state.total() / kMiB,
        state.optimizer / kMiB, to_string(cfg.ffn), to_string(cfg.classifier),
        nlohmann::json(spin.empty() ? "unset" : spin).dump(), median_img_per_s, chunk_list,
        gpu ? fmt::format(",\"mfu\":{:.4f},\"peak_mem_gib\":{:.3f}", mfu, mem_gib) : "",
        conv_stem ? ",\"stem\":\"conv\"" : "", graph_json,
        gpu ? ",\"kernel_calls\":" + route_calls_json(routes).dump() : "");
  } else {
    fmt::print("{}{} batch {} on {}: {:.1f} img/s, {:.1f} ms/step, {:.1f} GFLOP/s{}\n", model_name,
               arch.empty() ? "" : " (" + arch + ")", batch,
               gpu ? engine->description() : fmt::format("{} threads", omp_get_max_threads()),
               img_per_s, 1e3 * sec / steps, gflops,
               gpu ? fmt::format(", MFU {:.1f}% of 989 TFLOP/s, {:.2f} GiB device memory",
                                 100 * mfu, mem_gib)
                   : "");
    fmt::print("{}\n", format_state_memory(state, gpu, 1));
    const std::string ran = route_calls_text(routes);
    if (!ran.empty()) fmt::print("opt-in kernels (op calls, replays uncounted): {}\n", ran);
  }
  return 0;
}

}  // namespace vit
