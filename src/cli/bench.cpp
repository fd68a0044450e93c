// `vitrain bench`: training-step throughput (forward, backward, AdamW) on synthetic data.
#include "cli/bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <chrono>

#include "core/profile.h"
#include "core/rng.h"
#include "model/vit.h"
#include "train/optimizer.h"

namespace vit {

int run_bench(int argc, char** argv) {
  CLI::App app{"Measure training throughput of a model preset on synthetic data"};
  std::string model_name = "vit_bench_cpu", device = "cpu";
  int batch = 128, steps = 10, warmup = 2, img_size = 0, threads = 0;
  bool json = false;
  app.add_option("--model", model_name, "model preset");
  app.add_option("-b,--batch-size", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--img-size", img_size, "image size (0 = the preset's)");
  app.add_option("--steps", steps, "timed training steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "OpenMP threads (0 = all cores)");
  app.add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--json", json, "print one JSON line instead of text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  } catch (const CLI::ParseError& e) {
    throw Error(fmt::format("bench: {}", e.what()));
  }
  if (device == "cuda") throw Error("this build has no CUDA backend; use --device cpu");
  if (threads > 0) omp_set_num_threads(threads);

  ModelConfig cfg = model_preset(model_name);
  if (img_size > 0) cfg.img_size = img_size;
  cfg.validate();
  Vit<float> model(cfg, batch);
  AdamW<float> opt(model.table().total, model.table().num_decay, AdamWConfig{});
  const Index K = cfg.num_classes;
  std::vector<float> images(Index(batch) * cfg.in_chans * cfg.img_size * cfg.img_size);
  std::vector<float> targets(Index(batch) * K, 0.0f);
  Rng rng(1);
  for (auto& x : images) x = float(rng.normal());
  for (int b = 0; b < batch; ++b) targets[b * K + rng.below(K)] = 1.0f;

  auto step = [&] {
    model.zero_grad();
    model.forward(images.data(), targets.data(), batch, true, 0);
    model.backward(1.0f / batch);
    ProfileScope prof("adamw");
    opt.step(model.params.data(), model.grads.data(), 1e-4);
  };
  for (int i = 0; i < warmup; ++i) step();
  Profile::reset();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (Profile::enabled()) Profile::print(stderr);
  const double img_per_s = double(batch) * steps / sec;
  const double gflops = 3.0 * cfg.forward_flops_per_image() * img_per_s / 1e9;
  if (json) {
    fmt::print(
        "{{\"impl\":\"vitrain-cpu\",\"model\":\"{}\",\"batch\":{},\"threads\":{},"
        "\"img_per_s\":{:.2f},\"ms_per_step\":{:.2f},\"gflops\":{:.2f}}}\n",
        model_name, batch, omp_get_max_threads(), img_per_s, 1e3 * sec / steps, gflops);
  } else {
    fmt::print("{} batch {} on {} threads: {:.1f} img/s, {:.1f} ms/step, {:.1f} GFLOP/s\n",
               model_name, batch, omp_get_max_threads(), img_per_s, 1e3 * sec / steps, gflops);
  }
  return 0;
}

}  // namespace vit
