// `vitrain bench`: training-step throughput (forward, backward, AdamW) on synthetic data.
#include "cli/bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench_timing.h"
#include "cli/bench_variant_runs.h"
#include "cli/bench_variants.h"
#include "core/omp_wait.h"
#include "core/profile.h"
#include "core/rng.h"
#include "ops/kernel_options.h"
#include "train/engine.h"

namespace vit {

namespace {

// The command line's choices.
struct BenchArgs {
  std::string model_name = "vit_bench_cpu", device = "auto", precision = "bf16", stem, ffn, gp;
  int batch = 128, steps = 10, warmup = 2, img_size = 0, threads = 0, rounds = 3;
  bool json = false, profile = false, fp32_residual = false, cuda_graph = true;
  bool cuda_graph_given = false;  // --cuda-graph on the command line, not the default
  std::string kernels;
  std::vector<std::string> variant_specs;
};

// Parses the command line into `a`; false where it asked for --help (printed here). Throws
// vit::Error with one line on a bad flag.
bool parse_bench_args(int argc, char** argv, BenchArgs& a) {
  CLI::App app{"Measure training throughput of a model preset on synthetic data"};
  app.add_option("--model", a.model_name, "model preset");
  app.add_option("-b,--batch-size", a.batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--img-size", a.img_size, "image size (0 = the preset's)");
  app.add_option("--stem", a.stem, "patch embedding: patch or conv (default: the preset's)")
      ->check(CLI::IsMember({"patch", "conv"}));
  app.add_option("--ffn", a.ffn,
                 "FFN: mlp, mlp_tanh (GELU's tanh form) or local (default: the preset's)")
      ->check(CLI::IsMember({"mlp", "mlp_tanh", "local"}));
  app.add_option("--gp", a.gp, "classifier: token or avg (default: the preset's)")
      ->check(CLI::IsMember({"token", "avg"}));
  app.add_option("--steps", a.steps, "timed training steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", a.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", a.threads, "OpenMP threads (0 = all cores)");
  app.add_option("--device", a.device, "cpu, cuda, auto or emu (CPU bf16 emulation)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto", "emu"}));
  app.add_option("--precision", a.precision, "cuda: bf16 or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_flag("--fp32-residual", a.fp32_residual,
               "bf16 modes: the residual stream and its gradient in fp32");
  app.add_flag("--cuda-graph,!--no-cuda-graph", a.cuda_graph,
               "cuda: replay each step's forward and backward as a CUDA graph, as train does "
               "(on by default, off under --profile; --cuda-graph=false: launch each op); the "
               "warm-up is then at least 4 steps, so both input slots' graphs are captured "
               "before the timing");
  app.add_flag("--json", a.json, "print one JSON line instead of text");
  app.add_option("--kernels", a.kernels,
                 "kernel options k=v,... (the plan chooses the rest; --json reports it):\n" +
                     kernel_options_help());
  app.add_option("--variant", a.variant_specs,
                 "NAME:k=v,... (repeatable; a --kernels string, NAME: for the defaults): time "
                 "these kernel-plan presets against each other in this process, interleaved "
                 "over --rounds rounds, each run on an engine of its own after its own warm-up; "
                 "one line a variant with its median over the first's and its plan");
  app.add_option("--rounds", a.rounds, "with --variant: rounds over the variants")
      ->check(CLI::PositiveNumber);
  app.add_flag("--profile", a.profile,
               "per-op table of the timed steps on stderr: ms per step, share, achieved "
               "TFLOP/s or GB/s (device times on the GPU; also VIT_PROFILE=1)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return false;
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("bench: {}", e.what()));
  }
  a.cuda_graph_given = app.count("--cuda-graph") > 0;
  return true;
}

// The preset with the command line's overrides, validated.
ModelConfig bench_model(const BenchArgs& a) {
  ModelConfig cfg = model_preset(a.model_name);
  if (a.img_size > 0) cfg.img_size = a.img_size;
  if (!a.stem.empty()) cfg.stem = stem_from_string(a.stem);
  if (!a.ffn.empty()) cfg.ffn = ffn_from_string(a.ffn);
  if (!a.gp.empty()) cfg.classifier = classifier_from_string(a.gp);
  cfg.validate();
  return cfg;
}

// The bench's one synthetic batch: normal pixels and one-hot targets, the same every run.
struct SyntheticBatch {
  std::vector<float> images;   // (B, 3, img, img)
  std::vector<float> targets;  // (B, K)
};

SyntheticBatch synthetic_batch(const ModelConfig& cfg, int batch) {
  const Index K = cfg.num_classes;
  SyntheticBatch s;
  s.images.resize(Index(batch) * cfg.in_chans * cfg.img_size * cfg.img_size);
  s.targets.assign(Index(batch) * K, 0.0f);
  Rng rng(1);
  for (auto& x : s.images) x = float(rng.normal());
  for (int b = 0; b < batch; ++b) s.targets[b * K + rng.below(K)] = 1.0f;
  return s;
}

// The architecture's choices beyond the preset's name, for the text line ("" if none).
std::string arch_text(const ModelConfig& cfg) {
  std::string arch = cfg.stem == Stem::Conv ? "conv stem" : "";
  if (cfg.ffn == Ffn::Local) arch += arch.empty() ? "locality FFN" : ", locality FFN";
  if (cfg.ffn == Ffn::MlpTanh) arch += arch.empty() ? "tanh GELU" : ", tanh GELU";
  return arch;
}

// "fused" where the plan runs attention fused (the GPU and its emulation, at the head dims
// that have flash kernels), else "unfused".
std::string attention_kind(const Engine& engine) {
  const nlohmann::ordered_json plan = engine.kernel_plan();  // the loop below reads it
  for (const auto& e : plan.at("plan"))
    if (e.at("op") == "attention") return e.at("variant") == "flash" ? "fused" : "unfused";
  return "unfused";  // the CPU reference plans nothing: one kernel an op
}

// The run's one line (JSON or text; the text adds the state's memory).
void print_single_run(const Engine& engine, const BenchArgs& a, const EngineOptions& eo,
                      const BenchRun& run) {
  const ModelConfig& cfg = eo.cfg;
  const TimedSteps& t = run.timed;
  const double gflops = 3.0 * cfg.forward_flops_per_image() * t.img_per_s / 1e9;
  const bool gpu = engine.on_gpu();
  // MFU against the dense bf16 peak of an H100/H200 SXM (989 TFLOP/s), the yardstick.
  const double mfu = gflops * 1e9 / 989e12;
  const double mem_gib = engine.device_memory_bytes() / double(1 << 30);
  const double ms_per_step = 1e3 * t.sec / a.steps;
  const StateMemory state = engine.state_memory();  // weights, gradients, AdamW moments
  if (!a.json) {
    const std::string arch = arch_text(cfg);
    fmt::print("{}{} batch {} on {}: {:.1f} img/s, {:.1f} ms/step, {:.1f} GFLOP/s{}\n",
               a.model_name, arch.empty() ? "" : " (" + arch + ")", a.batch,
               gpu ? engine.description() : fmt::format("{} threads", omp_get_max_threads()),
               t.img_per_s, ms_per_step, gflops,
               gpu ? fmt::format(", MFU {:.1f}% of 989 TFLOP/s, {:.2f} GiB device memory",
                                 100 * mfu, mem_gib)
                   : "");
    fmt::print("{}\n", format_state_memory(state, gpu, 1));
    fmt::print("kernels: {}\n", to_string(eo.kernels));
    return;
  }
  const std::string spin = openmp_spin_setting();  // what libgomp runs with
  constexpr double kMiB = 1024.0 * 1024.0;
  fmt::print(
      "{{\"impl\":\"vitrain-{}\",\"device\":\"{}\",\"model\":\"{}\",\"batch\":{},"
      "\"threads\":{},\"attention\":\"{}\",\"img_per_s\":{:.2f},\"ms_per_step\":{:.2f},"
      "\"gflops\":{:.2f},\"state_mib\":{:.2f},\"optimizer_mib\":{:.2f},\"ffn\":\"{}\","
      "\"gp\":\"{}\",\"omp_spin\":{},\"median_img_per_s\":{:.2f},\"chunk_img_per_s\":[{}]{}{}"
      "{}{}}}\n",
      eo.device, engine.description(), a.model_name, a.batch, omp_get_max_threads(),
      attention_kind(engine), t.img_per_s, ms_per_step, gflops, state.total() / kMiB,
      state.optimizer / kMiB, to_string(cfg.ffn), to_string(cfg.classifier),
      nlohmann::json(spin.empty() ? "unset" : spin).dump(), t.median_img_per_s,
      rate_list(t.chunk_img_per_s),
      gpu ? fmt::format(",\"mfu\":{:.4f},\"peak_mem_gib\":{:.3f}", mfu, mem_gib) : "",
      cfg.stem == Stem::Conv ? ",\"stem\":\"conv\"" : "",
      // graphs asked for: how many timed passes were replays (all, or 0 where they did not
      // run: see stderr)
      eo.cuda_graph ? fmt::format(",\"graph_replays\":{}", run.graph_replays) : "",
      ",\"kernels\":" + engine.kernel_plan().dump());
}

}  // namespace

int run_bench(int argc, char** argv) {
  BenchArgs a;
  if (!parse_bench_args(argc, argv, a)) return 0;
  if (a.threads > 0) omp_set_num_threads(a.threads);
  const bool profiled = a.profile || Profile::enabled();
  VIT_CHECK(!(a.cuda_graph && profiled && a.cuda_graph_given),
            "bench: --cuda-graph and the op profile (--profile, VIT_PROFILE=1) do not go "
            "together: the profile times each op, a graph replays them all at once");
  if (a.profile) Profile::set_enabled(true);  // before the engine: it picks the timer
  std::vector<BenchVariant> variants;
  for (const std::string& spec : a.variant_specs) variants.push_back(parse_bench_variant(spec));
  check_bench_variants(variants);
  VIT_CHECK(variants.empty() || !profiled,
            "bench: --variant and the op profile (--profile, VIT_PROFILE=1) do not go together: "
            "the profile's table is one run's");

  EngineOptions eo;
  eo.cfg = bench_model(a);
  eo.device = resolve_device(a.device);
  // Graphs are the CUDA backend's (train's default there); the profile times op by op.
  eo.cuda_graph = a.cuda_graph && eo.device == "cuda" && !profiled;
  // Each of the two input slots' passes runs eagerly once, then is captured (pass_graphs.h).
  if (eo.cuda_graph) a.warmup = std::max(a.warmup, 4);
  eo.precision = a.precision;
  eo.fp32_residual = a.fp32_residual;
  eo.max_batch = a.batch;
  eo.kernels = parse_kernel_options(a.kernels);
  const SyntheticBatch data = synthetic_batch(eo.cfg, a.batch);
  auto step_on = [&](Engine& engine) {
    engine.zero_grad();
    engine.forward_backward(data.images.data(), data.targets.data(), a.batch,
                            1.0f / float(a.batch), 0);
    // AdamW reads params, grads, m, v and writes params, m, v: 7 fp32 per parameter.
    ProfileScope prof("adamw", {0.0, 28.0 * double(engine.table().total)});
    engine.step(1e-4);
  };
  if (!variants.empty()) {
    VIT_CHECK(a.kernels.empty(), "bench: --kernels and --variant do not go together (each "
                                 "variant names its kernels)");
    VariantBenchShape shape;
    shape.rounds = a.rounds;
    shape.warmup = a.warmup;
    shape.steps = a.steps;
    shape.batch = a.batch;
    shape.model_name = a.model_name;
    shape.flops_per_image = 3.0 * eo.cfg.forward_flops_per_image();
    shape.json = a.json;
    auto engine_with = [&](const KernelOptions& kernels) {
      EngineOptions variant = eo;
      variant.kernels = kernels;
      return make_engine(variant);
    };
    return run_bench_variants(engine_with, step_on, variants, shape);
  }
  std::unique_ptr<Engine> engine = make_engine(eo);
  const BenchRun run =
      warm_up_and_time(*engine, [&] { step_on(*engine); }, a.warmup, a.steps, a.batch);
  if (Profile::enabled()) Profile::print(stderr, a.steps);
  print_single_run(*engine, a, eo, run);
  return 0;
}

}  // namespace vit
