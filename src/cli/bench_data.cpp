#include "cli/bench_data.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/train_args.h"
#include "core/common.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/planned_batch.h"
#include "data/source.h"
#include "data/stage_clock.h"
#include "train/batch_config.h"
#include "train/engine.h"

namespace vit {
namespace {

struct BenchDataArgs {
  std::string data_dir, interpolation = "bilinear", device, precision = "bf16";
  std::string auto_augment;  // --aa
  double reprob = 0, color_jitter = 0;
  int img_size = 224, workers = 1, batch = 64, batches = 16;
  bool json = false, planned = false;
};

// The flags; nullopt after --help.
std::optional<BenchDataArgs> parse_args(int argc, char** argv) {
  CLI::App app{
      "Measure the training input pipeline: decode + RandomResizedCrop + flip (+ the "
      "augmentation flags) + normalise, images/s; with --device, into a device's model input",
      "bench-data"};
  BenchDataArgs a;
  app.add_option("--data-dir", a.data_dir, "ImageFolder root or vitrain prepare output")
      ->required();
  app.add_option("--img-size", a.img_size, "output side")->check(CLI::PositiveNumber);
  app.add_option("-j,--workers", a.workers, "loader threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-b,--batch-size", a.batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--batches", a.batches, "timed batches")->check(CLI::PositiveNumber);
  app.add_option("--interpolation", a.interpolation, "bilinear (torchvision's default) or bicubic")
      ->check(CLI::IsMember({"bilinear", "bicubic"}));
  app.add_option("--aa", a.auto_augment, "RandAugment, timm's grammar (rand-m9-mstd0.5-inc1)");
  app.add_option("--reprob", a.reprob, "random erasing probability");
  app.add_option("--color-jitter", a.color_jitter, "colour jitter strength");
  app.add_flag("--planned", a.planned,
               "workers decode and plan (crop box, flip, PIL tables, augmentation draws) and "
               "leave the resize, flip, augmentation and normalisation to the device's batched "
               "ops (--augment-on-device)");
  app.add_option("--device", a.device,
                 "also make each batch the model's input on this device (cpu, emu, cuda, auto), "
                 "as training does: the copy, and with --planned the input ops; without it, "
                 "the loader alone (host batches)")
      ->check(CLI::IsMember({"cpu", "emu", "cuda", "auto"}));
  app.add_option("--precision", a.precision, "cuda: bf16 or fp32 model input")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_flag("--json", a.json, "print one JSON line instead of text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    std::string m = e.what();
    std::replace(m.begin(), m.end(), '\n', ' ');
    throw Error(fmt::format("bench-data: {}", m));
  }
  return a;
}

// An engine whose model is one block over a single patch: only its input slot and the input
// ops matter, and the model never runs.
std::unique_ptr<Engine> input_engine(const BenchDataArgs& a, const std::string& device, Index C,
                                     Index K) {
  EngineOptions eo;
  eo.device = device;
  eo.precision = a.precision;
  eo.cfg.name = "bench_data_input";
  eo.cfg.img_size = a.img_size;
  eo.cfg.patch_size = a.img_size;
  eo.cfg.in_chans = int(C);
  eo.cfg.embed_dim = 32;
  eo.cfg.depth = 1;
  eo.cfg.num_heads = 1;
  eo.cfg.num_classes = int(K);
  eo.cfg.validate();
  eo.max_batch = a.batch;
  return make_engine(eo);
}

// What one timed run measured.
struct BenchDataResult {
  double seconds = 0, shipped_bytes = 0;
  data::StageTotals stages;
  int workers = 1;
  std::string device, engine;  // resolved device and engine description ("" without --device)
  double device_seconds = 0;   // the device's input stage alone over the same batch count
};

// One JSON line (nlohmann: the --aa text is the user's and needs escaping).
void print_json(const BenchDataArgs& a, const std::string& format, const BenchDataResult& r) {
  const double n_img = double(a.batch) * a.batches, ips = n_img / r.seconds;
  nlohmann::ordered_json j = {
      {"impl", "vitrain"},    {"format", format},     {"img_size", a.img_size},
      {"batch", a.batch},     {"workers", r.workers}, {"planned", a.planned},
      {"aa", a.auto_augment}, {"reprob", a.reprob},   {"color_jitter", a.color_jitter}};
  j["img_per_s"] = ips;
  j["img_per_s_per_worker"] = ips / r.workers;
  j["bytes_per_img"] = r.shipped_bytes / n_img;
  if (!r.engine.empty()) {
    j["device"] = r.device;
    j["engine"] = r.engine;
    j["device_img_per_s"] = n_img / r.device_seconds;
    j["device_ms_per_batch"] = 1e3 * r.device_seconds / a.batches;
  }
  // Shares of the workers' time (workers x wall); what no stage holds is queueing, idling and
  // the loop's own bookkeeping. The copy runs in the caller's thread, outside the workers.
  for (int i = 0; i < data::kNumStages; ++i)
    j[std::string(data::stage_name(data::Stage(i))) + "_pct"] =
        100.0 * r.stages.seconds[i] / (r.seconds * r.workers);
  fmt::print("{}\n", j.dump());
}

void print_text(const BenchDataArgs& a, const std::string& format, Index unreadable,
                const BenchDataResult& r) {
  const double n_img = double(a.batch) * a.batches, ips = n_img / r.seconds;
  std::string shares;
  for (int i = 0; i < data::kNumStages; ++i)
    shares += fmt::format("{}{} {:.1f}%", i ? ", " : "", data::stage_name(data::Stage(i)),
                          100.0 * r.stages.seconds[i] / (r.seconds * r.workers));
  fmt::print(
      "{} {}: {} px, {} workers{}{}: {:.1f} img/s ({:.1f} per worker), {} unreadable\n"
      "  {:.0f} bytes per image to the device ({})\n"
      "  share of worker time: {}\n",
      format, a.data_dir, a.img_size, r.workers, a.planned ? ", planned" : "",
      r.engine.empty() ? "" : ", into the model input on " + r.engine, ips, ips / r.workers,
      unreadable, r.shipped_bytes / n_img, a.planned ? "uint8 crops + tables" : "float images",
      shares);
  if (!r.engine.empty())
    fmt::print("  the input stage alone on {}: {:.3f} ms per batch ({:.1f} img/s)\n", r.engine,
               1e3 * r.device_seconds / a.batches, n_img / r.device_seconds);
}

}  // namespace

int run_bench_data(int argc, char** argv) {
  const std::optional<BenchDataArgs> parsed = parse_args(argc, argv);
  if (!parsed) return 0;
  const BenchDataArgs& a = *parsed;
  const data::DataSplits d = data::load_data_dir(a.data_dir);
  VIT_CHECK(d.streamed(), fmt::format("bench-data: '{}' holds {} data (in memory); point it at an "
                                      "ImageFolder root or a vitrain prepare folder",
                                      a.data_dir, d.format));
  TrainArgs ta;
  ta.train_interpolation = a.interpolation;
  ta.aa = a.auto_augment;
  ta.reprob = a.reprob;
  ta.color_jitter = a.color_jitter;
  validate_augment_args(ta);
  const data::BatchConfig cfg = train_batch_config(ta, a.img_size, d.mean, d.std, true);
  data::Loader loader(*d.train, a.batch, true, 42, {a.workers});
  VIT_CHECK(loader.batches_per_epoch() > 0,
            fmt::format("bench-data: batch size {} exceeds the {} training images", a.batch,
                        d.train->size()));
  const Index C = d.train->channels(), K = d.train->num_classes();
  BenchDataResult r;
  if (!a.device.empty()) r.device = resolve_device(a.device);  // probes the GPU: once
  std::unique_ptr<Engine> engine = r.device.empty() ? nullptr : input_engine(a, r.device, C, K);
  const std::vector<float> lut = data::normalize_lut(cfg, C);                // (C, 256)
  std::vector<float> images(size_t(a.batch) * C * a.img_size * a.img_size);  // (B, C, S, S)
  std::vector<float> targets(size_t(a.batch) * K);                           // (B, K)
  const Index nb = loader.batches_per_epoch();
  data::PlannedBatch plan;
  // One batch from the loader, then (with --device) into the engine's input.
  auto stage = [&] {
    if (!engine) return;
    if (a.planned)
      engine->stage_input_planned(plan, lut, targets.data());
    else
      engine->stage_input(images.data(), targets.data(), a.batch);
  };
  auto load = [&](Index i) {
    if (!a.planned) {
      loader.load(uint64_t(i / nb), i % nb, cfg, images.data(), targets.data());
      r.shipped_bytes += double(images.size() * sizeof(float));
    } else {
      loader.load_planned(uint64_t(i / nb), i % nb, cfg, plan, targets.data());
      r.shipped_bytes += double(plan.pixels.size() + plan.tables.size() * sizeof(int32_t) +
                                plan.samples.size() * sizeof(ResizeSample) +
                                plan.steps.size() * sizeof(PixelStep));
    }
    stage();
  };
  data::stage_clock_enable(true);
  load(0);  // warm-up: starts the workers, fills the page cache, sizes the device buffers
  if (engine) engine->synchronize();
  // The workers may already build the next batches: the stage sums cover whatever they did
  // from here to the end, which is the timed window up to the prefetch of its last batches.
  data::stage_clock_reset();
  r.shipped_bytes = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (Index i = 1; i <= a.batches; ++i) load(i);
  if (engine) engine->synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.stages = data::stage_clock_totals();
  data::stage_clock_enable(false);
  if (engine) {  // the device side alone: the last batch staged again, as often
    t0 = std::chrono::steady_clock::now();
    for (Index i = 1; i <= a.batches; ++i) stage();
    engine->synchronize();
    r.device_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  r.workers = std::max(1, loader.workers());
  if (engine) r.engine = engine->description();
  if (a.json)
    print_json(a, d.format, r);
  else
    print_text(a, d.format, d.train->unreadable_count(), r);
  return 0;
}

}  // namespace vit
